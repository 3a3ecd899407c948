"""Handoffs in Agent Framework under otel-guard: a handoff is a transfer into its target, open until it ran.

The workflows are real ``HandoffBuilder`` workflows (agent-framework-orchestrations) of real agents on
scripted chat clients (``agent_framework_loop``): a :class:`ScriptedClient` calls its handoff tool
(``handoff_to_budget``) on a fresh user turn and again whenever the conversation comes back to it,
and answers in text from a tool result; a :class:`StepsClient` plays the steps of a runtime's own
example. Interactive mode (the builder's default): after an answer that hands off to no one, the
workflow asks the user and ends. A handoff passes control, so handing the conversation back is no
cycle; a ping-pong stops at ``max_name_depth`` or ``max_depth``, the refusal the handoff call's result.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import wrapt
from agent_framework import Agent, AgentContext, AgentMiddleware, WorkflowEvent, tool
from agent_framework.exceptions import WorkflowConvergenceException
from agent_framework_loop import CallBudget, Handoffs, ScriptedClient, StepsClient, call
from agent_framework_orchestrations import HandoffBuilder
from agent_framework_support import decisions, framework_spans, guard_spans, instrumented_fixture, parent_of
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.agent_framework import HANDOFF_TARGETS, AgentFrameworkInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_ping_pong, refused

instrumented = instrumented_fixture()


def answers(events: list[WorkflowEvent[Any]]) -> list[str]:
    """The text of every agent response the workflow gave as output (an update's, streamed)."""
    return [e.data.text for e in events if e.type == "output" and e.data.text]


def handoffs(events: list[WorkflowEvent[Any]]) -> list[tuple[str, str]]:
    return [(e.data.source, e.data.target) for e in events if e.type == "handoff_sent"]


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- the customer-service shape: triage, a specialist, back to triage -----------------------------


@tool(approval_mode="never_require")
def check_order_status(order_number: str) -> str:
    """Check the status of an order."""
    return f"Order {order_number} ships in 2 business days."


@tool(approval_mode="never_require")
def process_return(order_number: str) -> str:
    """Start the return of an order."""
    chain = otel_guard.current_chain()
    assert chain is not None
    return f"Return of order {order_number} started along {chain.path()}."


def customer_support() -> tuple[Any, dict[str, StepsClient]]:
    """Agent Framework's customer-support handoff workflow (its docs' handoff rules: triage routes to
    the order and return agents, every specialist may hand back to triage), offline: triage hands off
    to the order agent, which checks the order and hands the customer back to triage, which hands off
    to the return agent, which starts the return and closes the conversation."""
    models = {
        "triage_agent": StepsClient(
            "triage_agent", [call("handoff_to_order_agent"), call("handoff_to_return_agent")]
        ),
        "order_agent": StepsClient(
            "order_agent", [call("check_order_status", order_number="1234"), call("handoff_to_triage_agent")]
        ),
        "return_agent": StepsClient(
            "return_agent", [call("process_return", order_number="1234"), "{result} You're welcome."]
        ),
    }
    tools = {"order_agent": [check_order_status], "return_agent": [process_return]}
    triage, order, returns = (
        Agent(
            client=models[name],
            name=name,
            instructions=f"You are the {name}.",
            tools=tools.get(name),
            require_per_service_call_history_persistence=True,
        )
        for name in models
    )
    workflow = (
        HandoffBuilder(
            name="customer_support_handoff",
            participants=[triage, order, returns],
            termination_condition=lambda conversation: (
                len(conversation) > 0 and "welcome" in conversation[-1].text.lower()
            ),
        )
        .with_start_agent(triage)
        .add_handoff(triage, [order, returns])
        .add_handoff(order, [triage])
        .add_handoff(returns, [triage])
        .build()
    )
    return workflow, models


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_the_customer_support_shape_hands_back_to_triage_and_runs_to_its_answer(
    instrumented: AgentFrameworkInstrumentor, spans: Any, streamed: bool
) -> None:
    workflow, models = customer_support()
    text = "Where is order 1234? It arrived damaged, so I would like to return it."

    if streamed:
        events = [event async for event in workflow.run(text, stream=True)]
    else:
        events = list(await workflow.run(text))

    assert handoffs(events) == [
        ("triage_agent", "order_agent"),
        ("order_agent", "triage_agent"),
        ("triage_agent", "return_agent"),
    ]
    assert "".join(answers(events)) == (
        "Return of order 1234 started along "
        "triage_agent ⇒ order_agent ⇒ triage_agent ⇒ return_agent → process_return. You're welcome."
    )
    assert all(model.steps == [] for model in models.values())  # every step played, none refused
    assert not [e for e in events if e.type == "request_info"]  # the termination condition ended it
    assert {attrs(s)["otel_guard.decision"] for s in guard_spans(spans)} == {"allow"}
    kinds = [(s.name, attrs(s)["otel_guard.hop.kind"]) for s in guard_spans(spans)]
    assert kinds == [
        ("invoke_agent triage_agent", "call"),
        ("invoke_agent order_agent", "transfer"),
        ("execute_tool check_order_status", "call"),
        ("invoke_agent triage_agent", "transfer"),
        ("invoke_agent return_agent", "transfer"),
        ("execute_tool process_return", "call"),
    ]
    transfers = [s for s in guard_spans(spans) if attrs(s)["otel_guard.hop.kind"] == "transfer"]
    assert all(attrs(s)["gen_ai.transfer.mode"] == "pass_control" for s in transfers)
    assert not any("gen_ai.transfer.mode" in attrs(s) for s in guard_spans(spans) if s not in transfers)
    assert attrs(transfers[1])["otel_guard.chain.agents"] == ("triage_agent", "order_agent", "triage_agent")
    # Each handoff's target runs inside it, and the next handoff is made there.
    for earlier, later in itertools.pairwise(transfers):
        assert earlier in _ancestors(later, spans)


# -- a ping-pong of handoffs ---------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_a_handoff_ping_pong_stops_at_max_name_depth_and_the_model_answers(
    instrumented: AgentFrameworkInstrumentor, spans: Any, streamed: bool
) -> None:
    otel_guard.configure(max_name_depth=3)
    team = Handoffs(max_tool_calls=20)

    events = await team.run("Plan the team offsite", streamed=streamed)

    # planner's run, then 5 handoffs taken: planner and budget stand 3 times each; budget's handoff
    # back, which would make planner stand a fourth time, was refused and not taken: budget's model
    # read the refusal as its tool's result and answered, and the workflow asked the user.
    assert handoffs(events) == [("planner", "budget"), ("budget", "planner")] * 2 + [("planner", "budget")]
    assert team.calls.made == 6
    assert (len(team.planner_client.requests), len(team.budget_client.requests)) == (3, 4)
    (refusal,) = team.budget_client.tool_results
    text = str(refusal.result)
    assert text.startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 3 times in chain planner ⇒ budget ⇒ planner ⇒ budget ⇒ planner ⇒ budget; "
        "the limit (max_name_depth) is 3"
    )
    assert "".join(answers(events)).startswith("budget answers after Refused by otel-guard")
    assert [e.type for e in events if e.type == "request_info"] == ["request_info"]

    # Each handoff is one transfer hop into its target; the target's run joined it (no second hop).
    path = ("planner", "budget") * 3
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", path[:1]),
        ("invoke_agent budget", "allow", path[:2]),
        ("invoke_agent planner", "allow", path[:3]),
        ("invoke_agent budget", "allow", path[:4]),
        ("invoke_agent planner", "allow", path[:5]),
        ("invoke_agent budget", "allow", path[:6]),
        ("invoke_agent planner", "refuse", (*path, "planner")),
    ]
    (refusal_span,) = refused(spans)
    assert attrs(refusal_span)["otel_guard.reason"] == "name_depth"
    assert attrs(refusal_span)["otel_guard.hop.kind"] == "transfer"

    # Budget's first run, in the next superstep, happened inside planner's handoff: Agent Framework's
    # span of it is a child of the handoff's hop, which is a child of planner's run; each hop stays
    # open until its target has run.
    planner_hop, handoff_hop = _by_name(spans)
    budget_run = min(
        (s for s in framework_spans(spans) if s.name == "invoke_agent budget"),
        key=lambda s: s.start_time or 0,
    )
    assert parent_of(budget_run, spans) is handoff_hop
    assert planner_hop in _ancestors(handoff_hop, spans)
    assert handoff_hop.end_time is not None
    assert budget_run.end_time is not None
    assert handoff_hop.end_time >= budget_run.end_time


async def test_with_the_default_limits_a_ping_pong_of_handoffs_stops_at_max_depth(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    team = Handoffs(max_tool_calls=20)

    events = await team.run("Plan the team offsite")

    # The run and 7 handoffs make 8 places; the eighth handoff (budget's) is refused.
    assert len(handoffs(events)) == 7
    assert team.calls.made == 8
    (refusal,) = team.budget_client.tool_results
    assert str(refusal.result).startswith("Refused by otel-guard (a2a_delegation_depth, reason: depth)")
    assert "the limit (max_depth) is 8" in str(refusal.result)
    (refusal_span,) = refused(spans)
    assert attrs(refusal_span)["otel_guard.chain.depth"] == 9


async def test_without_the_guard_a_ping_pong_of_handoffs_runs_into_the_workflows_own_limit(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # Suppressed, the guard steps aside: the workflow ends the ping-pong only at its 100 supersteps.
    team = Handoffs(max_tool_calls=500)

    with suppress_instrumentation(), pytest.raises(WorkflowConvergenceException, match="100 iterations"):
        await team.run("Plan the team offsite")

    assert team.calls.made == 100
    assert guard_spans(spans) == []


async def test_a_handoff_to_an_agent_still_waiting_for_its_tool_is_a_cycle(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # planner's tool ask_team runs a handoff workflow that starts at budget (planner waits for the
    # tool's answer); inside, budget hands off to the team's planner.
    team = Handoffs(start="budget", planner_tool=None)

    @tool
    async def ask_team(question: str) -> str:
        """Ask the team what the plan costs."""
        return " ".join(answers(await team.run(question)))

    planner = Agent(
        client=ScriptedClient("planner", "ask_team", team.calls), name="planner", tools=[ask_team]
    )

    result = await planner.run("Plan the team offsite")

    (refusal,) = team.budget_client.tool_results
    text = str(refusal.result)
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert "agent planner is already in chain planner → ask_team → budget." in text
    assert result.text == f"planner answers after budget answers after {text}"
    assert team.planner_client.requests == []  # the team's planner never ran
    (refusal_span,) = refused(spans)
    assert attrs(refusal_span)["otel_guard.hop.kind"] == "transfer"
    assert attrs(refusal_span)["otel_guard.reason"] == "cycle"


async def test_an_agent_called_as_a_tool_calling_back_its_caller_is_a_cycle_after_a_handoff(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # planner hands off to budget, which asks auditor (an agent offered as a tool); auditor's tool
    # runs budget again: budget waits for auditor's answer, so that is a cycle, handoff or not.
    participants: dict[str, Agent[Any]] = {}

    @tool
    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        return (await participants["budget"].run(question)).text

    auditor_client = ScriptedClient("auditor", "ask_budget", CallBudget(1))
    auditor = Agent(client=auditor_client, name="auditor", tools=[ask_budget])
    team = Handoffs(
        budget_tool="auditor", budget_tools=[auditor.as_tool(name="auditor", arg_name="question")]
    )
    participants.update(team.agents)

    events = await team.run("Plan the team offsite")

    assert handoffs(events) == [("planner", "budget")]
    (refusal,) = auditor_client.tool_results
    text = str(refusal.result)
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert "agent budget is already in chain planner ⇒ budget → auditor → ask_budget." in text
    (refusal_span,) = refused(spans)
    assert attrs(refusal_span)["otel_guard.hop.kind"] == "call"
    assert attrs(refusal_span)["otel_guard.chain.agents"] == (
        "planner",
        "budget",
        "auditor",
        "ask_budget",
        "budget",
    )


def _ancestors(span: Any, spans: Any) -> list[Any]:
    found = []
    parent = parent_of(span, spans)
    while parent is not None:
        found.append(parent)
        parent = parent_of(parent, spans)
    return found


def _by_name(spans: Any) -> tuple[Any, Any]:
    """planner's run's hop (the one call) and planner's handoff to budget (the first transfer)."""
    (planner_hop,) = [s for s in guard_spans(spans) if attrs(s)["otel_guard.hop.kind"] == "call"]
    handoff_hop = next(s for s in guard_spans(spans) if s.name == "invoke_agent budget")
    return planner_hop, handoff_hop


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
    assert [attrs(s)["otel_guard.hop.kind"] for s in guard_spans(spans)] == ["call", "transfer"]


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


async def test_observe_mode_lets_a_ping_pong_through_and_records_would_refuse(
    instrumented: AgentFrameworkInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(max_name_depth=2, mode="observe")
    team = Handoffs(max_tool_calls=6)

    events = await team.run("Plan the team offsite")

    # Every handoff was taken; only the models' budget of calls ended the ping-pong.
    assert len(handoffs(events)) == 6
    assert team.calls.made == 6
    assert not any("Refused" in text for text in answers(events))
    assert_observe_mode_recorded_the_ping_pong(spans, metric_reader)


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
