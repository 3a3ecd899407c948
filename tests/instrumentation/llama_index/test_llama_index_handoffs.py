"""LlamaIndex ``AgentWorkflow`` handoffs under otel-guard: a handoff is a transfer into the agent it names.

The workflows are real ``AgentWorkflow`` s of ``FunctionAgent`` s on LlamaIndex's own offline
``MockFunctionCallingLLM``: a :class:`~llama_index_loop.ScriptedModel` hands off on a fresh turn and
again whenever a handoff puts it in charge, and answers from a tool result; a
:class:`~llama_index_loop.StepsModel` plays the steps of LlamaIndex's own example. A handoff passes
control ("Handoff control of that chat to the given agent", LlamaIndex's handoff tool says), so
handing the conversation back is no cycle; a ping-pong stops at ``max_name_depth`` or ``max_depth``,
the refusal the handoff call's failed tool result.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from llama_index.core.agent.workflow import AgentWorkflow
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow.errors import WorkflowRuntimeError
from llama_index_loop import CallBudget, ScriptedModel, agent, build_handoffs
from llama_index_research import REVIEW, research_team
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otel_guard
from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor
from otel_guard.instrumentation.llama_index._runs import run_ends
from tests.hop_spans import (
    assert_observe_mode_recorded_the_ping_pong,
    chain_of,
    decisions,
    guard_spans,
    refused,
)

instrumented = instrumentor_fixture(LlamaIndexInstrumentor)


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


# -- LlamaIndex's research report: research, write, review, write again ----------------------------


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_the_research_report_goes_back_from_review_to_write_and_runs_to_its_answer(
    instrumented: LlamaIndexInstrumentor, spans: Any, streamed: bool
) -> None:
    workflow, models = research_team()

    handler = workflow.run(user_msg="Write a report on a real-time translation app.")
    if streamed:
        async for _ in handler.stream_events():
            pass
    output = await handler

    assert str(output) == (
        "Report written along ResearchAgent ⇒ WriteAgent ⇒ ReviewAgent ⇒ WriteAgent → write_report."
    )
    assert all(model.steps == [] for model in models.values())  # every step played
    assert not any(text.startswith("Refused") for model in models.values() for text in model.tool_results)
    state = await handler.ctx.store.get("state")
    assert state["report_content"] == "# Translation app\n\nVoice input. Offline mode."
    assert state["review"] == REVIEW
    assert state["research_notes"] == {"interfaces": "voice input, offline packs"}

    assert {attrs(s)["otel_guard.decision"] for s in guard_spans(spans)} == {"allow"}
    agents = [(s.name, attrs(s)["otel_guard.hop.kind"]) for s in guard_spans(spans) if "invoke" in s.name]
    assert agents == [
        ("invoke_agent ResearchAgent", "call"),
        ("invoke_agent WriteAgent", "transfer"),
        ("invoke_agent ReviewAgent", "transfer"),
        ("invoke_agent WriteAgent", "transfer"),
    ]
    tools = {attrs(s)["otel_guard.hop.kind"] for s in guard_spans(spans) if s.name.startswith("execute_tool")}
    assert tools == {"call"}
    transfers = [s for s in guard_spans(spans) if attrs(s)["otel_guard.hop.kind"] == "transfer"]
    assert all(attrs(s)["gen_ai.transfer.mode"] == "pass_control" for s in transfers)
    assert chain_of(transfers[-1], spans)[0] == (
        "ResearchAgent",
        "WriteAgent",
        "ReviewAgent",
        "WriteAgent",
    )
    # Each handoff is made in the one before (the agent in charge), and all end with the run.
    for earlier, later in itertools.pairwise(transfers):
        assert later.parent is not None
        assert later.parent.span_id == earlier.context.span_id
    assert run_ends.open_runs == 0


# -- a ping-pong of handoffs ---------------------------------------------------------------------


async def test_a_handoff_ping_pong_stops_at_max_name_depth_and_the_agent_in_charge_answers(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_name_depth=3)
    handoffs = build_handoffs(max_tool_calls=20)

    output = await handoffs.workflow.run(user_msg="Plan the team offsite")

    # planner's run, then 5 handoffs taken: planner and budget stand 3 times each; budget's handoff
    # back, which would make planner stand a fourth time, was refused: a failed tool result, which
    # budget's model read, and budget answered.
    assert handoffs.calls.made == 6
    (text,) = handoffs.budget_model.tool_results
    assert text.startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 3 times in chain planner ⇒ budget ⇒ planner ⇒ budget ⇒ planner ⇒ budget; "
        "the limit (max_name_depth) is 3"
    )
    assert str(output) == f"budget answers after: {text}"
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
    (refusal,) = refused(spans)
    assert attrs(refusal)["otel_guard.reason"] == "name_depth"
    assert attrs(refusal)["otel_guard.hop.kind"] == "transfer"
    # Each handoff stayed open while its agent was in charge: the next one sits under it.
    hops = guard_spans(spans)
    for earlier, later in itertools.pairwise(hops[1:]):
        assert later.parent is not None
        assert later.parent.span_id == earlier.context.span_id
        assert earlier.end_time is not None
        assert later.end_time is not None
        assert earlier.end_time >= later.end_time
    assert run_ends.open_runs == 0


async def test_with_the_default_limits_a_ping_pong_of_handoffs_stops_at_max_depth(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    handoffs = build_handoffs(max_tool_calls=20)

    output = await handoffs.workflow.run(user_msg="Plan the team offsite")

    # The run and 7 handoffs make 8 places; the eighth handoff (budget's) is refused, within
    # LlamaIndex's own 20 iterations.
    assert handoffs.calls.made == 8
    (text,) = handoffs.budget_model.tool_results
    assert text.startswith("Refused by otel-guard (a2a_delegation_depth, reason: depth)")
    assert "the limit (max_depth) is 8" in text
    assert str(output) == f"budget answers after: {text}"


async def test_without_the_guard_the_handoffs_run_into_llama_index_own_limit(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # Suppressed, the guard steps aside: the ping-pong goes on until LlamaIndex's 20 iterations.
    handoffs = build_handoffs(max_tool_calls=50)

    with suppress_instrumentation(), pytest.raises(WorkflowRuntimeError, match="Max iterations of 20"):
        await handoffs.workflow.run(user_msg="Plan the team offsite")

    assert handoffs.calls.made == 20
    assert guard_spans(spans) == []


async def test_observe_mode_lets_a_ping_pong_through_and_records_would_refuse(
    instrumented: LlamaIndexInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(max_name_depth=2, mode="observe")
    handoffs = build_handoffs(max_tool_calls=6)

    output = await handoffs.workflow.run(user_msg="Plan the team offsite")

    # Every handoff was taken; only the models' budget of calls ended the ping-pong.
    assert handoffs.calls.made == 6
    assert str(output) == "planner answers without tools"
    assert_observe_mode_recorded_the_ping_pong(spans, metric_reader)


# -- returns that are cycles ---------------------------------------------------------------------


async def test_a_handoff_to_an_agent_still_waiting_for_its_tool_is_a_cycle(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # planner's tool ask_team runs a workflow that starts at budget (planner waits for the tool's
    # answer); inside, budget hands off to the team's planner.
    calls = CallBudget(6)
    budget_model = ScriptedModel("budget", "handoff", calls, handoff_to="planner")
    team_planner = ScriptedModel("planner", None, calls)
    team = AgentWorkflow(
        agents=[
            agent("budget", budget_model, [], can_handoff_to=["planner"]),
            agent("planner", team_planner, []),
        ],
        root_agent="budget",
    )

    async def ask_team(question: str) -> str:
        """Ask the team what the plan costs."""
        return str(await team.run(user_msg=question))

    planner_model = ScriptedModel("planner", "ask_team", calls)
    planner = agent("planner", planner_model, [FunctionTool.from_defaults(async_fn=ask_team)])

    output = await planner.run(user_msg="Plan the team offsite")

    (text,) = budget_model.tool_results
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert "agent planner is already in chain planner → budget." in text  # the team in ask_team's place
    assert str(output) == f"planner answers after: budget answers after: {text}"
    assert team_planner.requests == []  # the team's planner never ran
    (refusal,) = refused(spans)
    assert attrs(refusal)["otel_guard.hop.kind"] == "transfer"
    assert attrs(refusal)["otel_guard.reason"] == "cycle"


async def test_an_agent_called_as_a_tool_calling_back_its_caller_is_a_cycle_after_a_handoff(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # planner hands off to budget, whose tool runs auditor; auditor's tool runs budget again: budget
    # waits for auditor's answer, so that is a cycle, handoff or not.
    calls = CallBudget(6)
    auditor_model = ScriptedModel("auditor", "ask_budget", calls)
    budget_model = ScriptedModel("budget", "ask_auditor", calls)

    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        return str(await agent("budget", budget_model, []).run(user_msg=question))

    async def ask_auditor(question: str) -> str:
        """Ask the auditor to check a price."""
        tools = [FunctionTool.from_defaults(async_fn=ask_budget)]
        return str(await agent("auditor", auditor_model, tools).run(user_msg=question))

    planner_model = ScriptedModel("planner", "handoff", calls, handoff_to="budget")
    workflow = AgentWorkflow(
        agents=[
            agent("planner", planner_model, [], can_handoff_to=["budget"]),
            agent("budget", budget_model, [FunctionTool.from_defaults(async_fn=ask_auditor)]),
        ],
        root_agent="planner",
    )

    output = await workflow.run(user_msg="Plan the team offsite")

    (text,) = auditor_model.tool_results
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert "agent budget is already in chain planner ⇒ budget → auditor." in text
    assert str(output) == f"budget answers after: auditor answers after: {text}"
    (refusal,) = refused(spans)
    assert attrs(refusal)["otel_guard.hop.kind"] == "call"
    assert chain_of(refusal, spans)[0] == ("planner", "budget", "auditor", "budget")


# -- a handoff LlamaIndex does not take ------------------------------------------------------------


async def test_a_handoff_llama_index_does_not_take_ends_at_once(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # Planner may hand off only to budget; asked for fx, LlamaIndex's handoff tool says no.
    calls = CallBudget(1)
    planner_model = ScriptedModel("planner", "handoff", calls, handoff_to="fx")
    workflow = AgentWorkflow(
        agents=[
            agent("planner", planner_model, [], can_handoff_to=["budget"]),
            agent("budget", ScriptedModel("budget", None, calls), []),
            agent("fx", ScriptedModel("fx", None, calls), []),
        ],
        root_agent="planner",
    )

    output = await workflow.run(user_msg="Plan the team offsite")

    (text,) = planner_model.tool_results
    assert text.startswith("Agent fx cannot hand off")  # LlamaIndex's own answer, not a refusal
    assert str(output) == f"planner answers after: {text}"
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent fx", "allow", ("planner", "fx")),
    ]
    planner_run, handoff = guard_spans(spans)
    assert attrs(handoff)["otel_guard.hop.kind"] == "transfer"
    assert handoff.end_time is not None
    assert planner_run.end_time is not None
    assert handoff.end_time < planner_run.end_time  # ended with the call, not kept for the run
