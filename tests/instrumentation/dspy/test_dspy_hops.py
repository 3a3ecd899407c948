"""DSPy under otel-guard: module calls, tool calls and modules used as tools are hops, and a refusal
reaches the ReAct model as the tool's error observation, with its text.

The agents are real ``dspy.ReAct`` modules on scripted ``DummyLM`` models (``dspy_loop.py``); spans and
metrics go to the session's in-memory SDK (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import dspy
import pytest
from dspy_loop import CallBudget, ScriptedLM, build_loop, react
from instrumentors import instrumentor_fixture
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otel_guard
from otel_guard.instrumentation.dspy import DSPyInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_loop, decisions, guard_spans, refused

instrumented = instrumentor_fixture(DSPyInstrumentor)

PLANNER_PATH = "planner → ask_budget → budget → ask_planner"
ERROR = "Execution error in ask_planner:"  # how ReAct hands a tool's error to its model
REFUSED = "ToolCallRefused: Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:"

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
    instrumented: DSPyInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    answer = loop.planner()(question="Plan the team offsite").answer

    # Budget's call back into planner ran its tool, whose planner run was refused: two tool calls
    # in all, and both agents answered.
    assert loop.calls.made == 2
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert answer.startswith(f"planner answers after budget answers after {ERROR}")

    # The budget model read the refusal as its tool's error observation: reason, path, do not retry.
    (text,) = loop.budget_lm.observations
    assert text.startswith(ERROR)
    assert REFUSED in text
    assert f"agent planner is already in chain {PLANNER_PATH}." in text
    assert "do not call it again" in text

    assert decisions(spans) == THROUGH_TOOLS
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]
    assert len({span.context.trace_id for span in guard_spans(spans)}) == 1


def test_the_async_loop_is_stopped_at_the_same_bounce(instrumented: DSPyInstrumentor, spans: Any) -> None:
    loop = build_loop()

    async def run() -> str:
        planner = react("planner", loop.planner_lm, [async_ask(loop)])
        return str((await planner.acall(question="Plan the team offsite")).answer)

    answer = asyncio.run(run())

    assert answer.startswith("planner answers after budget answers after Execution error in ask_planner:")
    (text,) = loop.budget_lm.observations
    assert REFUSED in text
    assert decisions(spans) == THROUGH_TOOLS


def async_ask(loop: Any) -> Any:
    """Planner's tool, async: budget's run through ``acall``, whose own tool asks planner the same way."""

    async def ask_budget(question: str) -> str:
        async def ask_planner(question: str) -> str:
            planner = react("planner", loop.planner_lm, [ask_budget])
            return str((await planner.acall(question=question)).answer)

        budget = react("budget", loop.budget_lm, [ask_planner])
        return str((await budget.acall(question=question)).answer)

    return ask_budget


def test_the_agent_rule_stops_the_loop_at_the_same_bounce(instrumented: DSPyInstrumentor, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    loop.planner()(question="Plan the team offsite")

    assert loop.calls.made == 2
    assert [d for _, d, _ in decisions(spans)] == ["allow", "allow", "allow", "allow", "refuse"]


def test_a_module_used_as_a_tool_is_one_hop_into_it(instrumented: DSPyInstrumentor, spans: Any) -> None:
    loop = build_loop(as_tools=True)

    answer = loop.planner()(question="Plan the team offsite").answer

    assert loop.calls.made == 2
    assert answer.startswith("planner answers after Prediction(")
    (text,) = loop.budget_lm.observations
    assert text.startswith("Execution error in planner:")
    assert "Delegation cycle: agent planner is already in chain planner → budget." in text
    # The tool call is the hop into the module, and the module's run joins it: one place each.
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]


def test_a_healthy_run_is_unchanged(instrumented: DSPyInstrumentor, spans: Any) -> None:
    def run() -> str:
        lm = ScriptedLM("planner", "lookup", CallBudget(1))
        return str(react("planner", lm, [lookup])(question="offsite").answer)

    guarded = run()
    with suppress_instrumentation():
        bare = run()

    assert guarded == bare == "planner answers after found planner asks"
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool lookup", "allow", ("planner", "lookup")),
    ]


def test_dspy_s_own_steps_and_the_finish_tool_are_no_hops(instrumented: DSPyInstrumentor, spans: Any) -> None:
    # An unnamed ReAct outside any module is its class; its Predict, ChainOfThought and finish are
    # steps of its run.
    lm = ScriptedLM("planner", None, CallBudget(0))
    agent = dspy.ReAct("question -> answer", tools=[lookup])
    agent.set_lm(lm)
    agent(question="offsite")

    assert lm.requests == 2  # ReAct's step (finish) and its extract
    assert decisions(spans) == [("invoke_agent ReAct", "allow", ("ReAct",))]


def test_a_module_of_the_app_s_own_is_named_by_its_class(instrumented: DSPyInstrumentor, spans: Any) -> None:
    class Summarizer(dspy.Module):
        def __init__(self) -> None:
            super().__init__()
            self.agent = dspy.ReAct("question -> answer", tools=[lookup])

        def forward(self, question: str) -> Any:
            return self.agent(question=question)

    summarizer = Summarizer()
    summarizer.set_lm(ScriptedLM("summarizer", "lookup", CallBudget(1)))
    summarizer(question="offsite")

    assert decisions(spans) == [
        ("invoke_agent Summarizer", "allow", ("Summarizer",)),
        ("execute_tool lookup", "allow", ("Summarizer", "lookup")),
    ]


def test_a_refused_run_outside_any_tool_raises_before_its_forward(
    instrumented: DSPyInstrumentor, spans: Any
) -> None:
    lm = ScriptedLM("planner", None, CallBudget(0))
    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused, match="cycle"):
        react("planner", lm, [lookup])(question="offsite")
    assert lm.requests == 0


def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: DSPyInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(mode="observe")
    loop = build_loop()

    loop.planner()(question="Plan the team offsite")

    assert loop.calls.made == 6  # the scripted models bounded the loop
    assert all("Refused" not in text for text in loop.budget_lm.observations)
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


def test_suppressed_instrumentation_makes_no_hop(instrumented: DSPyInstrumentor, spans: Any) -> None:
    loop = build_loop(calls=2)
    with suppress_instrumentation():
        loop.planner()(question="Plan the team offsite")
    assert guard_spans(spans) == []


def test_uninstrument_restores_dspy(spans: Any) -> None:
    instrumentor = DSPyInstrumentor()
    instrumentor.instrument()
    instrumentor.uninstrument()

    loop = build_loop(calls=2)
    loop.planner()(question="Plan the team offsite")

    assert loop.calls.made == 2
    assert guard_spans(spans) == []
