"""Google ADK under otel-guard: transfers (``transfer_to_agent``) are transfers, sub-agents called as
tools (``mode="single_turn"``) or given tasks (``mode="task"``) are calls, each a hop into the agent,
decided when the model asks, and a refusal is what the model reads.

A transfer passes control (the agent transferring waits for nothing), so handing the conversation back
to the parent or root agent (which ADK allows) is no cycle, while a ping-pong of transfers stops at
``max_depth`` / ``max_name_depth`` (ADK's own bound is ``RunConfig.max_llm_calls``, 500 by default).
A return that is no transfer (an ``AgentTool`` calling back the agent that called it, a sub-agent call
back into its caller) is a cycle. ADK 2 runs these agents outside the calling agent's run (a
transfer's target after it, a sub-agent in the context ADK captured before the call): the chain must
reach them all the same.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
from google.adk.agents import LlmAgent, RunConfig
from google.adk.agents.invocation_context import LlmCallsLimitExceededError
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools.agent_tool import AgentTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from google_adk_models import (
    ScriptedModel,
    Seen,
    StepsModel,
    ToolCalls,
    final_text,
    run,
    transferring_agents,
)
from google_adk_spans import decisions, guard_spans, parent_of
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_ping_pong, chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(GoogleADKInstrumentor)

TRANSFER = "transfer_to_agent"


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def to(agent: str) -> tuple[str, dict[str, Any]]:
    """A step of a script: transfer to ``agent``."""
    return TRANSFER, {"agent_name": agent}


def customer_service() -> tuple[LlmAgent, LlmAgent, LlmAgent]:
    """The OpenAI Agents SDK's customer-service example in ADK's shape: the root agent triage transfers
    to its sub-agent faq, which hands the customer back to triage (its parent), which transfers to
    seat_booking, which books the seat and answers."""

    def update_seat(confirmation_number: str, new_seat: str) -> str:
        """Update the seat for a given confirmation number."""
        chain = otel_guard.current_chain()
        assert chain is not None
        return f"Seat {new_seat} booked along {chain.path()}"

    faq = LlmAgent(
        name="faq", description="Answers questions.", model=StepsModel(agent="faq", steps=[to("triage")])
    )
    seat_booking = LlmAgent(
        name="seat_booking",
        description="Books seats.",
        model=StepsModel(
            agent="seat_booking", steps=[("update_seat", {"confirmation_number": "LX42", "new_seat": "12A"})]
        ),
        tools=[update_seat],
    )
    triage = LlmAgent(
        name="triage",
        model=StepsModel(agent="triage", steps=[to("faq"), to("seat_booking")]),
        sub_agents=[faq, seat_booking],
    )
    return triage, faq, seat_booking


# -- a hand-back is no cycle --------------------------------------------------------------------


async def test_the_customer_service_shape_hands_back_to_the_root_and_runs_to_its_answer(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    triage, faq, seat_booking = customer_service()

    events = await run(triage, "How many bags may I bring, and can I have seat 12A?")

    assert final_text(events) == (
        "seat_booking answers after update_seat: "
        "{'result': 'Seat 12A booked along triage ⇒ faq ⇒ triage ⇒ seat_booking → update_seat'}"
    )
    assert [
        e.author for e in events if e.content and e.content.parts and e.content.parts[0].function_call
    ] == [
        "triage",
        "faq",
        "triage",
        "seat_booking",
    ]
    for agent in (triage, faq, seat_booking):
        model: StepsModel = agent.model  # type: ignore[assignment]
        assert model.steps == []
        assert model.errors == []
    assert decisions(spans) == [
        ("invoke_agent triage", "allow", ("triage",)),
        ("invoke_agent faq", "allow", ("triage", "faq")),
        ("invoke_agent triage", "allow", ("triage", "faq", "triage")),
        ("invoke_agent seat_booking", "allow", ("triage", "faq", "triage", "seat_booking")),
        ("execute_tool update_seat", "allow", ("triage", "faq", "triage", "seat_booking", "update_seat")),
    ]
    hops = guard_spans(spans)
    assert attrs(hops[0])["otel_guard.hop.kind"] == "call"  # the root agent's run
    assert "gen_ai.transfer.mode" not in attrs(hops[0])
    for transfer in hops[1:4]:
        assert attrs(transfer)["otel_guard.hop.kind"] == "transfer"
        assert attrs(transfer)["gen_ai.transfer.mode"] == "pass_control"
        # Decided in the transferring agent's call, under ADK's span of it.
        assert parent_of(transfer, spans).name == f"execute_tool {TRANSFER}"
    assert attrs(hops[4])["otel_guard.hop.kind"] == "call"


async def test_without_the_guard_the_agents_transfer_until_the_scripts_give_up(spans: Any) -> None:
    pair = transferring_agents()

    await run(pair.planner)

    assert pair.tool_calls.left == 0
    assert guard_spans(spans) == []


async def test_a_transfers_hop_is_opened_by_its_target_under_the_call_that_asked_for_it(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents(max_tool_calls=1)  # planner -> budget; budget answers

    events = await run(pair.planner)

    assert final_text(events) == "budget answers without tools"
    transfer = next(s for s in guard_spans(spans) if s.name == "invoke_agent budget")
    # The transfer_to_agent tool is no hop: the hop is the target's, and no name stands twice.
    assert transfer.attributes is not None
    assert chain_of(transfer, spans)[0] == ("planner", "budget")
    assert parent_of(transfer, spans).name == "execute_tool transfer_to_agent"  # ADK's span of the call
    adk_budget = [s for s in spans.named("invoke_agent budget") if s is not transfer]
    assert [parent_of(s, spans) for s in adk_budget] == [transfer]  # ADK's run of budget, inside ours


async def test_a_transfer_onward_to_a_peer_carries_the_whole_path(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    calls = ToolCalls(2)
    fx = LlmAgent(name="fx", model=ScriptedModel(agent="fx"))
    budget = LlmAgent(
        name="budget",
        model=ScriptedModel(
            agent="budget", tool="transfer_to_agent", tool_args={"agent_name": "fx"}, tool_calls=calls
        ),
    )
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="transfer_to_agent", tool_args={"agent_name": "budget"}, tool_calls=calls
        ),
        sub_agents=[budget, fx],
    )

    events = await run(planner)

    assert final_text(events) == "fx answers without tools"
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent fx", "allow", ("planner", "budget", "fx")),
    ]


async def test_a_tool_of_its_own_that_transfers_back_hands_back_too(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents(max_tool_calls=2)  # planner -> budget, budget's tool -> planner
    bodies: list[str] = []

    def hand_back(tool_context: ToolContext) -> str:
        """Hand the conversation back to the planner."""
        bodies.append("hand_back")
        tool_context.actions.transfer_to_agent = "planner"
        return "handing back"

    pair.budget.tools = [hand_back]
    pair.budget_model.tool, pair.budget_model.tool_args = "hand_back", {}

    events = await run(pair.planner)

    assert bodies == ["hand_back"]
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("execute_tool hand_back", "allow", ("planner", "budget", "hand_back")),
        ("invoke_agent planner", "allow", ("planner", "budget", "planner")),
    ]
    assert attrs(guard_spans(spans)[-1])["otel_guard.hop.kind"] == "transfer"
    assert pair.budget_model.errors == []
    assert len(pair.planner_model.requests) == 2  # planner took over again, and answered
    assert final_text(events) == "planner answers without tools"


async def test_a_refused_transfer_by_a_tool_of_its_own_is_withdrawn(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_name_depth=1)  # planner may stand once: the hand-back is refused
    pair = transferring_agents(max_tool_calls=2)
    bodies: list[str] = []

    def hand_back(tool_context: ToolContext) -> str:
        """Hand the conversation back to the planner."""
        bodies.append("hand_back")
        tool_context.actions.transfer_to_agent = "planner"
        return "handing back"

    pair.budget.tools = [hand_back]
    pair.budget_model.tool, pair.budget_model.tool_args = "hand_back", {}

    events = await run(pair.planner)

    assert bodies == ["hand_back"]  # the tool ran (a hop of its own); the transfer it asked for did not
    assert decisions(spans)[-1] == ("invoke_agent planner", "refuse", ("planner", "budget", "planner"))
    (error,) = pair.budget_model.errors
    assert "reason: name_depth" in error
    assert "agent planner already stands 1 times in chain planner ⇒ budget" in error
    assert len(pair.planner_model.requests) == 1
    assert events[-1].author == "budget"


# -- a ping-pong of transfers stops at a limit --------------------------------------------------


async def test_with_the_default_limits_a_ping_pong_of_transfers_stops_at_max_depth(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents(max_tool_calls=20)

    events = await run(pair.planner)

    # The root agent's run and 7 transfers fill the 8 places of max_depth: the eighth transfer (budget
    # back to planner) is refused, long before ADK's max_llm_calls (500). Budget stays and answers.
    assert pair.tool_calls.left == 20 - 8
    (error,) = pair.budget_model.errors
    assert error.startswith("Refused by otel-guard (a2a_delegation_depth, reason: depth)")
    assert "the limit (max_depth) is 8" in error
    assert final_text(events) == "budget answers after transfer_to_agent error"
    assert events[-1].author == "budget"
    refused = [s for s in guard_spans(spans) if attrs(s)["otel_guard.decision"] == "refuse"]
    assert [(s.name, attrs(s)["otel_guard.hop.kind"]) for s in refused] == [
        ("invoke_agent planner", "transfer")
    ]


async def test_a_ping_pong_of_transfers_stops_at_max_name_depth(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_name_depth=3)
    pair = transferring_agents(max_tool_calls=20)

    events = await run(pair.planner)

    # planner stands at places 1, 3, 5 and budget at 2, 4, 6: the sixth transfer would make planner
    # stand a fourth time.
    assert pair.tool_calls.left == 20 - 6
    assert pair.planner_model.errors == []
    (error,) = pair.budget_model.errors
    assert error.startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 3 times in chain planner ⇒ budget ⇒ planner ⇒ budget ⇒ planner ⇒ budget; "
        "the limit (max_name_depth) is 3"
    )
    assert final_text(events) == "budget answers after transfer_to_agent error"
    assert [d[:2] for d in decisions(spans)] == [
        *[("invoke_agent planner", "allow"), ("invoke_agent budget", "allow")] * 3,
        ("invoke_agent planner", "refuse"),
    ]


async def test_adks_max_llm_calls_stops_a_ping_pong_where_it_comes_first(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents(max_tool_calls=20)

    with pytest.raises(LlmCallsLimitExceededError):
        await run(pair.planner, run_config=RunConfig(max_llm_calls=4))

    # ADK's own limit: four model requests, four transfers asked for; the fifth request is ADK's error.
    assert pair.tool_calls.left == 20 - 4
    assert {d[1] for d in decisions(spans)} == {"allow"}
    assert len(decisions(spans)) == 5  # the root's run and four transfers, each recorded


async def test_observe_mode_lets_the_transfers_through_and_records_would_refuse(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_name_depth=2)
    pair = transferring_agents(max_tool_calls=6)

    await run(pair.planner)

    assert pair.tool_calls.left == 0  # only the scripts ended the loop
    assert pair.budget_model.errors == []
    assert_observe_mode_recorded_the_ping_pong(spans)


async def test_a_transfer_whose_target_never_runs_is_still_recorded(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(agent="planner", tool="leave", tool_args={}, tool_calls=ToolCalls(1)),
    )

    def leave(tool_context: ToolContext) -> str:
        """Transfer to an agent that is not in the tree."""
        tool_context.actions.transfer_to_agent = "nowhere"
        return "leaving"

    planner.tools = [leave]

    with pytest.raises(ValueError, match="nowhere"):  # ADK's own answer to the unknown target
        await run(planner)

    (hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent nowhere"]
    assert hop.attributes is not None
    assert chain_of(hop, spans)[0] == ("planner", "nowhere")
    assert hop.attributes["otel_guard.hop.kind"] == "transfer"
    assert hop.status.status_code == StatusCode.ERROR  # ended with the run's error


# -- a return that is no transfer is still a cycle ----------------------------------------------


async def test_an_agent_tool_calling_back_its_caller_is_a_cycle_after_a_transfer(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    # triage transfers to faq; faq asks lookup (an AgentTool), which asks faq back (an AgentTool):
    # faq waits for lookup's answer, so that is a cycle.
    calls = ToolCalls(2)
    faq = LlmAgent(
        name="faq",
        model=ScriptedModel(agent="faq", tool="lookup", tool_args={"request": "bags?"}, tool_calls=calls),
    )
    lookup = LlmAgent(
        name="lookup",
        model=ScriptedModel(agent="lookup", tool="faq", tool_args={"request": "rule?"}, tool_calls=calls),
    )
    faq.tools.append(AgentTool(lookup))
    lookup.tools.append(AgentTool(faq))
    triage = LlmAgent(name="triage", model=StepsModel(agent="triage", steps=[to("faq")]), sub_agents=[faq])

    events = await run(triage)

    assert decisions(spans) == [
        ("invoke_agent triage", "allow", ("triage",)),
        ("invoke_agent faq", "allow", ("triage", "faq")),
        ("invoke_agent lookup", "allow", ("triage", "faq", "lookup")),
        ("invoke_agent faq", "refuse", ("triage", "faq", "lookup", "faq")),
    ]
    refused = guard_spans(spans)[-1]
    assert (attrs(refused)["otel_guard.hop.kind"], attrs(refused)["otel_guard.reason"]) == ("call", "cycle")
    (error,) = lookup.model.errors  # type: ignore[union-attr]
    assert "Delegation cycle: agent faq is already in chain triage ⇒ faq → lookup" in error
    assert final_text(events) == "faq answers after lookup ok"


async def test_a_transfer_to_an_agent_that_waits_for_its_agent_tool_is_a_cycle(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    # planner asks budget as an AgentTool; budget transfers to its own sub-agent named planner. The
    # planner that called budget still waits for its answer: a cycle.
    inner = LlmAgent(name="planner", model=ScriptedModel(agent="inner planner"))
    budget = LlmAgent(
        name="budget", model=StepsModel(agent="budget", steps=[to("planner")]), sub_agents=[inner]
    )
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="budget", tool_args={"request": "price it"}, tool_calls=ToolCalls(1)
        ),
        tools=[AgentTool(budget)],
    )

    events = await run(planner)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    refused = guard_spans(spans)[-1]
    assert (attrs(refused)["otel_guard.hop.kind"], attrs(refused)["otel_guard.reason"]) == (
        "transfer",
        "cycle",
    )
    (error,) = budget.model.errors  # type: ignore[union-attr]
    assert "Delegation cycle: agent planner is already in chain planner → budget" in error
    assert inner.model.requests == []  # type: ignore[union-attr]  # the transfer never happened
    assert final_text(events) == "planner answers after budget ok"


# -- sub-agents as tools ------------------------------------------------------------------------


async def test_a_single_turn_sub_agent_is_one_hop_and_its_call_back_is_refused(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    calls = ToolCalls(6)
    budget = LlmAgent(
        name="budget",
        mode="single_turn",
        model=ScriptedModel(agent="budget", tool="planner", tool_calls=calls),
    )
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="budget", tool_args={"request": "price it"}, tool_calls=calls
        ),
        sub_agents=[budget],
    )
    budget.tools.append(AgentTool(planner))

    events = await run(planner)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert calls.left == 6 - 2
    assert final_text(events) == "planner answers after budget ok"
    # A sub-agent called as a tool answers its caller, which waits: a call, and the call back a cycle.
    assert [attrs(s)["otel_guard.hop.kind"] for s in guard_spans(spans)] == ["call"] * 3
    assert attrs(guard_spans(spans)[-1])["otel_guard.reason"] == "cycle"


class TaskModel(ScriptedModel):
    """A task agent's script: calls its tool once, then ``finish_task`` with what came back."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(Seen.of(llm_request))
        newest = llm_request.contents[-1]
        returned = [p.function_response for p in newest.parts or [] if p.function_response]
        self.function_responses.extend(r for r in returned if r is not None)
        if returned and returned[0] is not None and returned[0].name == "finish_task":
            part = types.Part.from_text(text=f"{self.agent} is done")
        elif returned:
            part = types.Part.from_function_call(
                name="finish_task", args={"result": f"{self.agent}'s result"}
            )
        else:
            part = types.Part.from_function_call(name=self.tool, args={"request": "the plan?"})
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def planner_with_task_budget() -> tuple[LlmAgent, LlmAgent]:
    budget = LlmAgent(name="budget", mode="task", model=TaskModel(agent="budget", tool="planner"))
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="budget", tool_args={"request": "price it"}, tool_calls=ToolCalls(1)
        ),
        sub_agents=[budget],
    )
    budget.tools.append(AgentTool(planner))
    return planner, budget


async def test_a_task_agent_runs_inside_its_coordinators_chain(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    planner, budget = planner_with_task_budget()

    events = await run(planner)

    # ADK dispatches the task itself (no tool callback), and re-enters the planner after it: one hop.
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert "already in chain planner → budget" in budget.model.errors[0]  # type: ignore[union-attr]
    assert final_text(events) == "planner answers after budget ok"
    assert [attrs(s)["otel_guard.hop.kind"] for s in guard_spans(spans)] == ["call"] * 3  # a task is a call


async def test_a_refused_task_delegation_answers_the_coordinator_with_the_refusal(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner, budget = planner_with_task_budget()

    with otel_guard.delegate("budget"):  # budget is already on the path: the task call is a cycle
        events = await run(planner)

    assert budget.model.requests == []  # type: ignore[union-attr]  # the task agent never ran
    (error,) = planner.model.errors  # type: ignore[union-attr]
    assert "Delegation cycle: agent budget is already in chain budget → planner" in error
    assert final_text(events) == "planner answers after budget error"
    assert decisions(spans)[-1] == ("invoke_agent budget", "refuse", ("budget", "planner", "budget"))
