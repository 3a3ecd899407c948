"""OpenAI Agents SDK handoffs: a transfer into the target agent, open for the rest of the run.

A handoff passes control, so a hand-back (the SDK's customer-service example) is no cycle; a
ping-pong of handoffs stops at max_name_depth (or max_depth), and the refusal is the handoff call's
output, which the agent in charge reads and answers from."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    Runner,
    function_tool,
    handoff,
    input_guardrail,
)
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from openai_agents_helpers import REFUSAL, attrs, last_tool_output
from openai_agents_models import CallBudget, LoopModel, agents_handing_off_to_each_other

import otel_guard
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_ping_pong, chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)


async def run(planner: Agent[object], *, streamed: bool) -> object:
    if not streamed:
        return (await Runner.run(planner, "Plan a trip to Lisbon.")).final_output
    result = Runner.run_streamed(planner, "Plan a trip to Lisbon.")
    async for _ in result.stream_events():
        pass
    await asyncio.sleep(0)  # the run's hop ends in the run task's done callback
    return result.final_output


@input_guardrail
async def harmless(context: object, agent: object, user_input: object) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=False)


def customer_service() -> tuple[Agent[Any], Agent[Any], Agent[Any]]:
    """The SDK's customer-service example (examples/customer_service/main.py), offline: triage hands
    off to the FAQ agent, which looks the answer up and hands the customer back to triage, which
    hands off to seat booking, which books the seat and answers."""

    @function_tool
    def faq_lookup_tool(question: str) -> str:
        """Look up frequently asked questions."""
        return "You are allowed to bring one bag on the plane."

    @function_tool
    def update_seat(confirmation_number: str, new_seat: str) -> str:
        """Update the seat for a given confirmation number."""
        chain = otel_guard.current_chain()
        assert chain is not None
        return f"Seat {new_seat} booked along {chain.path()}"

    faq_agent = Agent(name="FAQ Agent", handoff_description="Answers questions about the airline.")
    faq_agent.tools = [faq_lookup_tool]
    seat_booking_agent = Agent(name="Seat Booking Agent", handoff_description="Updates a seat.")
    seat_booking_agent.tools = [update_seat]
    triage_agent = Agent(name="Triage Agent", handoffs=[faq_agent, handoff(agent=seat_booking_agent)])
    faq_agent.handoffs = [triage_agent]
    seat_booking_agent.handoffs = [triage_agent]
    triage_agent.model = ScriptedModel(
        [
            [function_call("transfer_to_faq_agent", {}, call_id="h1")],
            [function_call("transfer_to_seat_booking_agent", {}, call_id="h3")],
        ]
    )
    faq_agent.model = ScriptedModel(
        [
            [function_call("faq_lookup_tool", {"question": "How many bags?"}, call_id="t1")],
            [function_call("transfer_to_triage_agent", {}, call_id="h2")],
        ]
    )
    seat_booking_agent.model = ScriptedModel(
        [
            [function_call("update_seat", {"confirmation_number": "LX42", "new_seat": "12A"}, call_id="t2")],
            ModelStep.respond(lambda call: [assistant_message(_last_output(call))]),
        ]
    )
    return triage_agent, faq_agent, seat_booking_agent


def _last_output(call: Any) -> str:
    return str(call.input[-1]["output"])


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_the_customer_service_shape_hands_back_to_triage_and_runs_to_its_answer(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any, streamed: bool
) -> None:
    triage, faq, seats = customer_service()

    final_output = await run(triage, streamed=streamed)

    assert final_output == (
        "Seat 12A booked along Triage Agent ⇒ FAQ Agent ⇒ Triage Agent ⇒ Seat Booking Agent → update_seat"
    )
    for agent in (triage, faq, seats):
        agent.model.assert_complete()  # type: ignore[union-attr]
    decisions = {attrs(s)["otel_guard.decision"] for s in spans.all() if "otel_guard.decision" in attrs(s)}
    assert decisions == {"allow"}
    first, back = sorted(spans.named("invoke_agent Triage Agent"), key=lambda s: s.start_time)
    assert attrs(first)["otel_guard.hop.kind"] == "call"
    assert "gen_ai.transfer.mode" not in attrs(first)
    for span in (spans.one("invoke_agent FAQ Agent"), back, spans.one("invoke_agent Seat Booking Agent")):
        assert attrs(span)["otel_guard.hop.kind"] == "transfer"
        assert attrs(span)["gen_ai.transfer.mode"] == "pass_control"
    assert chain_of(back, spans)[0] == ("Triage Agent", "FAQ Agent", "Triage Agent")
    assert attrs(spans.one("execute_tool update_seat"))["otel_guard.hop.kind"] == "call"


@pytest.mark.parametrize(
    ("streamed", "guardrail"),
    [(False, False), (True, False), (False, True)],
    # With a parallel input guardrail, the SDK runs the first turn in a task of its own.
    ids=["run", "run_streamed", "run_with_parallel_guardrail"],
)
async def test_a_handoff_ping_pong_stops_at_max_name_depth_and_the_current_agent_answers(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any, streamed: bool, guardrail: bool
) -> None:
    otel_guard.configure(cycle_rule="agent", max_name_depth=3)
    budget = CallBudget(20)
    planner, budget_agent = agents_handing_off_to_each_other(budget)
    if guardrail:
        planner.input_guardrails = [harmless]

    final_output = await run(planner, streamed=streamed)

    # planner (the run), then 5 handoffs taken: planner and budget stand 3 times each; the sixth
    # handoff would make planner stand a fourth time (within the SDK's own max_turns of 10).
    assert budget.made == 6
    assert len(planner.model.calls) == 3  # type: ignore[attr-defined]
    refusal = last_tool_output(budget_agent.model)  # type: ignore[arg-type]
    assert refusal.startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 3 times in chain planner ⇒ budget ⇒ planner ⇒ budget ⇒ planner ⇒ budget; "
        "the limit (max_name_depth) is 3"
    )
    assert final_output == f"budget answers: {refusal}"

    refused = [s for s in spans.all() if attrs(s).get("otel_guard.decision") == "refuse"]
    assert [s.name for s in refused] == ["invoke_agent planner"]
    assert attrs(refused[0])["otel_guard.hop.kind"] == "transfer"
    handoffs = [s for s in spans.all() if attrs(s).get("otel_guard.hop.kind") == "transfer"]
    assert len(handoffs) == 6  # 5 taken and the refused one
    # Each handoff's turns run inside the previous handoff's hop, and end with the run.
    run_span = next(
        s for s in spans.named("invoke_agent planner") if attrs(s)["otel_guard.hop.kind"] == "call"
    )
    by_depth = sorted(handoffs, key=lambda s: attrs(s)["otel_guard.chain.depth"])
    assert by_depth[0].parent.span_id == run_span.context.span_id
    for parent, child in itertools.pairwise(by_depth):
        assert child.parent.span_id == parent.context.span_id
    assert all(s.end_time <= run_span.end_time for s in handoffs)


async def test_with_the_default_limits_a_ping_pong_of_handoffs_stops_at_max_depth(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    budget = CallBudget(20)
    planner, budget_agent = agents_handing_off_to_each_other(budget)

    final_output = await run(planner, streamed=False)

    assert budget.made == 8  # the run and 7 handoffs make 8 places: the eighth handoff is refused
    refusal = last_tool_output(budget_agent.model)  # type: ignore[arg-type]
    assert refusal.startswith("Refused by otel-guard (a2a_delegation_depth, reason: depth)")
    assert "the limit (max_depth) is 8" in refusal
    assert final_output == f"budget answers: {refusal}"


async def test_a_handoff_back_to_an_agent_still_waiting_for_its_tool_is_a_cycle(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any
) -> None:
    # planner asks budget as a tool (it waits for the answer); inside, budget hands off to planner.
    budget = CallBudget(2)
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget_agent = Agent(name="budget", instructions="Price the plan.", handoffs=[planner])
    planner.tools = [budget_agent.as_tool("budget", "Ask the budget agent.")]
    planner.model = LoopModel("planner", "budget", budget)
    budget_agent.model = LoopModel("budget", "transfer_to_planner", budget)

    final_output = await Runner.run(planner, "Plan a trip to Lisbon.")

    assert budget.made == 2
    refusal = last_tool_output(budget_agent.model)
    assert refusal.startswith(REFUSAL)
    assert final_output.final_output == f"planner answers: budget answers: {refusal}"
    refused = next(
        s for s in spans.named("invoke_agent planner") if attrs(s)["otel_guard.decision"] == "refuse"
    )
    assert attrs(refused)["otel_guard.hop.kind"] == "transfer"
    assert attrs(refused)["otel_guard.reason"] == "cycle"


async def test_tools_after_a_handoff_run_in_the_target_agents_hop(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    seen: list[tuple[str, ...]] = []

    @function_tool
    def price(input: str) -> str:
        """Price something."""
        chain = otel_guard.current_chain()
        assert chain is not None
        seen.append(tuple(hop.agent for hop in chain.hops))
        return "42 EUR"

    budget_agent = Agent(name="budget", tools=[price])
    budget_agent.model = LoopModel("budget", "price", CallBudget(1))
    planner = Agent(name="planner", handoffs=[budget_agent])
    planner.model = LoopModel("planner", "transfer_to_budget", CallBudget(1))

    result = await Runner.run(planner, "What does it cost?")

    assert result.final_output == "budget answers: 42 EUR"
    assert seen == [("planner", "budget", "price")]
    assert spans.one("execute_tool price").parent.span_id == (
        spans.one("invoke_agent budget").context.span_id
    )


async def test_observe_mode_lets_handoffs_loop_and_records_would_refuse(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_name_depth=2, mode="observe")
    budget = CallBudget(6)
    planner, _ = agents_handing_off_to_each_other(budget)

    final_output = await run(planner, streamed=False)

    assert budget.made == 6  # only the models' budget ended the loop
    assert len(planner.model.calls) == 4  # type: ignore[attr-defined]
    assert "Refused" not in str(final_output)
    assert_observe_mode_recorded_the_ping_pong(spans)


async def test_a_run_resumed_after_a_handoff_goes_on_in_the_target_agents_hop(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    @function_tool(needs_approval=True)
    def book(input: str) -> str:
        """Book it (needs approval)."""
        chain = otel_guard.current_chain()
        assert chain is not None
        return " > ".join(hop.agent for hop in chain.hops)

    budget_agent = Agent(name="budget", tools=[book])
    budget_agent.model = LoopModel("budget", "book", CallBudget(1))
    planner = Agent(name="planner", handoffs=[budget_agent])
    planner.model = LoopModel("planner", "transfer_to_budget", CallBudget(1))

    first = await Runner.run(planner, "Book the trip.")
    assert [item.name for item in first.interruptions] == ["book"]
    state = first.to_state()
    state.approve(first.interruptions[0])
    spans.clear()
    resumed = await Runner.run(planner, state)

    assert resumed.final_output == "budget answers: planner > budget > book"
    tool_span = spans.one("execute_tool book")
    assert tool_span.parent.span_id == spans.one("invoke_agent budget").context.span_id
