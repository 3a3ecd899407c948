"""Agno under otel-guard: agent runs and tool calls are hops, and a refusal reaches the model as the
tool call's error result, with its text.

The agents are real ``agno.agent.Agent``s on a scripted ``agno.models.base.Model`` (``agno_loop.py``);
spans and metrics go to the session's in-memory SDK (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agno.agent import Agent
from agno_loop import CallBudget, build_loop, scripted
from instrumentors import instrumentor_fixture
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otel_guard
from otel_guard.instrumentation.agno import AgnoInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_loop, decisions, guard_spans, refused

instrumented = instrumentor_fixture(AgnoInstrumentor)

REFUSED = (
    "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle: agent planner is already "
    "in chain planner → ask_budget → budget → ask_planner. This call will be refused again if retried; "
    "do not call it again. Continue with the information you already have and answer."
)
THROUGH_TOOLS = [
    ("invoke_agent planner", "allow", ("planner",)),
    ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
    ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
    ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
    ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
]


def lookup(question: str) -> str:
    """Look the question up."""
    return f"found {question}"


def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: AgnoInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    output = loop.planner().run("Plan the team offsite")

    # Budget's call back into planner ran its tool, whose planner run was refused: planner's model
    # ran one turn, two tool calls in all, and both agents answered.
    assert loop.calls.made == 2
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert loop.budget_model.tool_results == [REFUSED]  # the tool call's error result, the refusal's text
    assert output.content == f"planner answers after budget answers after {REFUSED}"
    assert str(output.status) == "RunStatus.completed"

    assert decisions(spans) == THROUGH_TOOLS
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]
    assert len({span.context.trace_id for span in guard_spans(spans)}) == 1


def test_the_async_loop_is_stopped_at_the_same_bounce(instrumented: AgnoInstrumentor, spans: Any) -> None:
    loop = build_loop()

    async def ask_budget(question: str) -> str:
        """Ask the budget."""

        async def ask_planner(question: str) -> str:
            """Ask the planner."""
            planner = Agent(name="planner", model=loop.planner_model, tools=[ask_budget], telemetry=False)
            return str((await planner.arun(question)).content)

        budget = Agent(name="budget", model=loop.budget_model, tools=[ask_planner], telemetry=False)
        return str((await budget.arun(question)).content)

    planner = Agent(name="planner", model=loop.planner_model, tools=[ask_budget], telemetry=False)
    output = asyncio.run(planner.arun("Plan the team offsite"))

    assert loop.budget_model.tool_results == [REFUSED]
    assert output.content == f"planner answers after budget answers after {REFUSED}"
    assert decisions(spans) == THROUGH_TOOLS


def test_a_streamed_run_is_one_hop_open_until_its_last_event(
    instrumented: AgnoInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    events = list(loop.planner().run("Plan the team offsite", stream=True))

    assert events
    assert loop.budget_model.tool_results == [REFUSED]
    assert decisions(spans) == THROUGH_TOOLS


def test_the_agent_rule_stops_the_loop_at_the_same_bounce(instrumented: AgnoInstrumentor, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    loop.planner().run("Plan the team offsite")

    assert loop.calls.made == 2
    assert [d for _, d, _ in decisions(spans)] == ["allow", "allow", "allow", "allow", "refuse"]


def test_a_healthy_run_is_unchanged(instrumented: AgnoInstrumentor, spans: Any) -> None:
    def run() -> Any:
        model = scripted("planner", "lookup", CallBudget(1), question="offsite")
        return Agent(name="planner", model=model, tools=[lookup], telemetry=False).run("offsite").content

    guarded = run()
    with suppress_instrumentation():
        bare = run()

    assert guarded == bare == "planner answers after found offsite"
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool lookup", "allow", ("planner", "lookup")),
    ]


def test_a_tool_named_like_its_agent_is_one_hop(instrumented: AgnoInstrumentor, spans: Any) -> None:
    inner = Agent(name="lookup", model=scripted("lookup", "", CallBudget(0)), telemetry=False)

    def lookup(question: str) -> str:
        """Ask the lookup agent."""
        return str(inner.run(question).content)

    model = scripted("planner", "lookup", CallBudget(1), question="offsite")
    Agent(name="planner", model=model, tools=[lookup], telemetry=False).run("offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool lookup", "allow", ("planner", "lookup")),
    ]


def test_a_refused_run_outside_any_tool_raises_before_it_starts(instrumented: AgnoInstrumentor) -> None:
    model = scripted("planner", "", CallBudget(0))
    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused, match="cycle"):
        Agent(name="planner", model=model, telemetry=False).run("offsite")
    assert model.requests == 0


def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: AgnoInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(mode="observe")
    loop = build_loop()

    loop.planner().run("Plan the team offsite")

    assert loop.calls.made == 6  # the scripted models bounded the loop
    assert all("Refused" not in text for text in loop.budget_model.tool_results)
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


def test_suppressed_instrumentation_makes_no_hop(instrumented: AgnoInstrumentor, spans: Any) -> None:
    loop = build_loop(calls=2)
    with suppress_instrumentation():
        loop.planner().run("Plan the team offsite")
    assert guard_spans(spans) == []


def test_uninstrument_restores_agno(spans: Any) -> None:
    instrumentor = AgnoInstrumentor()
    instrumentor.instrument()
    instrumentor.uninstrument()

    loop = build_loop(calls=2)
    loop.planner().run("Plan the team offsite")

    assert loop.calls.made == 2
    assert guard_spans(spans) == []


def test_a_run_in_a_session_names_its_conversation(instrumented: AgnoInstrumentor, spans: Any) -> None:
    model = scripted("planner", "", CallBudget(0))
    Agent(name="planner", model=model, telemetry=False).run("offsite", session_id="trip-42")
    Agent(name="planner", model=model, session_id="trip-43", telemetry=False).run("offsite")

    ids = [dict(s.attributes or {}).get("gen_ai.conversation.id") for s in guard_spans(spans)]
    assert ids == ["trip-42", "trip-43"]
