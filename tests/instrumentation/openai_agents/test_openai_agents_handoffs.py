"""OpenAI Agents SDK handoffs: a hop into the target agent, open for the rest of the run."""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    Runner,
    function_tool,
    input_guardrail,
)
from openai_agents_helpers import REFUSAL, attrs, last_tool_output
from openai_agents_models import CallBudget, LoopModel, agents_handing_off_to_each_other

import otel_guard
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
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


@pytest.mark.parametrize(
    ("streamed", "guardrail"),
    [(False, False), (True, False), (False, True)],
    # With a parallel input guardrail, the SDK runs the first turn in a task of its own.
    ids=["run", "run_streamed", "run_with_parallel_guardrail"],
)
async def test_handoff_back_is_refused_and_the_current_agent_answers(
    instrumentor: OpenAIAgentsInstrumentor, spans, streamed: bool, guardrail: bool
) -> None:
    otel_guard.configure(cycle_rule="agent")
    budget = CallBudget(10)
    planner, budget_agent = agents_handing_off_to_each_other(budget)
    if guardrail:
        planner.input_guardrails = [harmless]

    final_output = await run(planner, streamed=streamed)

    assert budget.made == 2  # planner -> budget taken, budget -> planner refused
    assert len(planner.model.calls) == 1  # planner never took over again
    refusal = last_tool_output(budget_agent.model)
    assert refusal.startswith(REFUSAL)
    assert final_output == f"budget answers: {refusal}"

    run_span = next(
        s for s in spans.named("invoke_agent planner") if attrs(s)["otel_guard.decision"] == "allow"
    )
    handoff_span = spans.one("invoke_agent budget")
    refused = next(
        s for s in spans.named("invoke_agent planner") if attrs(s)["otel_guard.decision"] == "refuse"
    )
    assert attrs(handoff_span)["otel_guard.chain.agents"] == ("planner", "budget")
    assert attrs(refused)["otel_guard.chain.agents"] == ("planner", "budget", "planner")
    assert handoff_span.parent.span_id == run_span.context.span_id
    # budget's turns run inside the handoff's hop: its handoff back is checked against it.
    assert refused.parent.span_id == handoff_span.context.span_id
    # The handoff hop lasts for budget's part of the run and ends with it.
    assert handoff_span.end_time <= run_span.end_time


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
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    budget = CallBudget(3)
    planner, _ = agents_handing_off_to_each_other(budget)

    final_output = await run(planner, streamed=False)

    assert budget.made == 3  # planner -> budget -> planner -> budget, then the model's budget ends
    assert len(planner.model.calls) == 1 + 1  # planner took over again
    assert "Refused" not in str(final_output)
    would = [s for s in spans.all() if attrs(s)["otel_guard.decision"] == "would_refuse"]
    assert [s.name for s in would] == ["invoke_agent budget", "invoke_agent planner"]
    assert all([e.name for e in s.events] == ["otel_guard.would_refuse"] for s in would)


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
