"""Handoffs in Agent Framework under otel-guard: a handoff is a hop into its target, open until it ran.

The workflows are real ``HandoffBuilder`` workflows (agent-framework-orchestrations) of real agents on
scripted chat clients (``agent_framework_loop.ScriptedClient``): on a fresh user turn a model calls its
handoff tool (``handoff_to_budget``), on a tool result it answers in text. Interactive mode (the
builder's default): after an answer that hands off to no one, the workflow asks the user and ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import wrapt
from agent_framework import AgentContext, AgentMiddleware, WorkflowEvent, tool
from agent_framework_loop import Handoffs
from agent_framework_support import decisions, framework_spans, guard_spans, instrumented_fixture, parent_of
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.agent_framework import HANDOFF_TARGETS, AgentFrameworkInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_loop, refused

instrumented = instrumented_fixture()


def answers(events: list[WorkflowEvent[Any]]) -> list[str]:
    """The text of every agent response the workflow gave as output (an update's, streamed)."""
    return [e.data.text for e in events if e.type == "output" and e.data.text]


def handoffs(events: list[WorkflowEvent[Any]]) -> list[tuple[str, str]]:
    return [(e.data.source, e.data.target) for e in events if e.type == "handoff_sent"]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_a_handoff_back_is_refused_at_the_first_bounce_and_the_model_answers(
    instrumented: AgentFrameworkInstrumentor, spans: Any, streamed: bool
) -> None:
    team = Handoffs()

    events = await team.run("Plan the team offsite", streamed=streamed)

    # Planner handed off to budget; budget's handoff back was refused and not taken: budget's model
    # read the refusal as its tool's result and answered, and the workflow asked the user.
    assert handoffs(events) == [("planner", "budget")]
    assert team.calls.made == 2
    assert (len(team.planner_client.requests), len(team.budget_client.requests)) == (1, 2)
    (refusal,) = team.budget_client.tool_results
    text = str(refusal.result)
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert "agent planner is already in chain planner → budget" in text
    assert "do not call it again" in text
    assert "".join(answers(events)).startswith("budget answers after Refused by otel-guard")
    assert [e.type for e in events if e.type == "request_info"] == ["request_info"]

    # The handoff is one hop into budget; budget's run joined it (no second budget hop).
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    (refusal_span,) = refused(spans)
    assert refusal_span.attributes is not None
    assert refusal_span.attributes["otel_guard.reason"] == "cycle"

    # Budget's run, in the next superstep, happened inside the handoff: Agent Framework's span of it
    # is a child of the handoff's hop, which is a child of planner's run.
    planner_hop, handoff_hop = _by_name(spans)
    (budget_run,) = [s for s in framework_spans(spans) if s.name == "invoke_agent budget"]
    assert parent_of(budget_run, spans) is handoff_hop
    assert planner_hop in _ancestors(handoff_hop, spans)
    assert handoff_hop.end_time is not None
    assert budget_run.end_time is not None
    assert handoff_hop.end_time >= budget_run.end_time  # open until its target had run


def _ancestors(span: Any, spans: Any) -> list[Any]:
    found = []
    parent = parent_of(span, spans)
    while parent is not None:
        found.append(parent)
        parent = parent_of(parent, spans)
    return found


def _by_name(spans: Any) -> tuple[Any, Any]:
    (planner_hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent planner" and _allowed(s)]
    (handoff_hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent budget"]
    return planner_hop, handoff_hop


def _allowed(span: Any) -> bool:
    return bool(span.attributes and span.attributes["otel_guard.decision"] == "allow")


async def test_a_healthy_handoff_is_allowed_and_its_target_answers(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    team = Handoffs(budget_tool=None)

    events = await team.run("Plan the team offsite")

    assert handoffs(events) == [("planner", "budget")]
    assert answers(events) == ["budget answers without tools"]
    assert refused(spans) == []
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
    ]


async def test_a_handoff_behind_a_context_provider_is_one_hop_too(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # With a context provider, the workflow adds its handoff middleware through the provider, after
    # the guard's function middleware: the guard's sees the handoff call and leaves it to the handoff.
    team = Handoffs(budget_tool=None, context_provider=True)

    events = await team.run("Plan the team offsite")

    assert handoffs(events) == [("planner", "budget")]
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
    ]


async def test_observe_mode_lets_the_handoff_back_through_and_records_would_refuse(
    instrumented: AgentFrameworkInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    team = Handoffs()

    events = await team.run("Plan the team offsite")

    # The handoff back was taken: planner ran again, read the handoff's result and answered.
    assert handoffs(events) == [("planner", "budget"), ("budget", "planner")]
    assert not any("Refused" in str(result.result) for result in team.budget_client.tool_results)
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "would_refuse", ("planner", "budget", "planner")),
    ]
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


async def test_the_handoffs_target_counts_in_the_tree_of_the_agent_that_handed_off(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)

    @tool
    def lookup_prices(question: str) -> str:
        """Look up what things cost."""
        return "prices"

    team = Handoffs(budget_tool="lookup_prices", budget_tools=[lookup_prices])

    events = await team.run("Plan the team offsite")

    # Planner's request (the handoff) and budget's first (the lookup) made the tree's two: budget's
    # second, in its own run but the same tree, was not sent; the run answered with the reason.
    assert handoffs(events) == [("planner", "budget")]
    assert (len(team.planner_client.requests), len(team.budget_client.requests)) == (1, 1)
    assert answers(events) == [
        f"Delegation budget: tree {_root(spans)} has made its 2 model requests (max_model_requests 2); "
        "the model request is refused"
    ]
    (handoff_hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent budget"]
    (event,) = handoff_hop.events
    assert event.name == "otel_guard.refused"
    assert event.attributes is not None
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


def _root(spans: Any) -> str:
    (root,) = {s.attributes["otel_guard.chain.root"] for s in guard_spans(spans) if s.attributes}
    return str(root)


class FailsAfterTheRun(AgentMiddleware):  # type: ignore[misc]
    """The app's own middleware, failing once the run (its handoff made) is done."""

    async def process(self, context: AgentContext, call_next: Callable[[], Awaitable[None]]) -> None:
        await call_next()
        raise RuntimeError("post-processing failed")


async def test_a_handoff_whose_run_then_fails_ends_with_the_error_and_is_never_taken(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    team = Handoffs(budget_tool=None, planner_middleware=[FailsAfterTheRun()])

    with pytest.raises(RuntimeError, match="post-processing failed"):
        await team.run("Plan the team offsite")

    assert team.budget_client.requests == []
    (handoff_hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent budget"]
    assert handoff_hop.status.status_code is StatusCode.ERROR
    assert handoff_hop.attributes is not None
    assert handoff_hop.attributes["error.type"] == "RuntimeError"


async def test_suppressed_instrumentation_makes_no_handoff_hop(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    team = Handoffs(max_tool_calls=3)

    with suppress_instrumentation():
        events = await team.run("Plan the team offsite")

    assert handoffs(events)[:2] == [("planner", "budget"), ("budget", "planner")]
    assert guard_spans(spans) == []


async def test_uninstrument_leaves_handoffs_unguarded(spans: Any) -> None:
    proxy = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
    instrumentor = AgentFrameworkInstrumentor()
    instrumentor.instrument()
    assert all(isinstance(resolve(target), proxy) for target in HANDOFF_TARGETS)
    instrumentor.uninstrument()
    assert not any(isinstance(resolve(target), proxy) for target in HANDOFF_TARGETS)
    team = Handoffs(max_tool_calls=3)

    events = await team.run("Plan the team offsite")

    assert handoffs(events)[:2] == [("planner", "budget"), ("budget", "planner")]
    assert guard_spans(spans) == []
