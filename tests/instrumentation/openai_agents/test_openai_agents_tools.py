"""OpenAI Agents SDK function tools: each call is a hop; a refusal is the tool's output."""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    RunContextWrapper,
    Runner,
    default_tool_error_function,
    function_tool,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from openai_agents_helpers import attrs, last_tool_output
from openai_agents_models import CallBudget, LoopModel
from pydantic import BaseModel

import otel_guard
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from tests.hop_spans import chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)


class Quote(BaseModel):
    amount: int


def chain_agents() -> str:
    chain = otel_guard.current_chain()
    assert chain is not None
    return " > ".join(hop.agent for hop in chain.hops)


async def test_function_tool_call_is_an_execute_tool_hop(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    ran: list[str] = []

    @function_tool
    def lookup_price(input: str) -> str:
        """Look up a price."""
        ran.append(input)
        chain = otel_guard.current_chain()
        assert chain is not None
        return " > ".join(hop.agent for hop in chain.hops)

    planner = Agent(name="planner", tools=[lookup_price])
    planner.model = LoopModel("planner", "lookup_price", CallBudget(1))

    result = await Runner.run(planner, "What does a hotel cost?")

    assert ran == ["question from planner"]
    assert result.final_output == "planner answers: planner > lookup_price"
    tool_span = spans.one("execute_tool lookup_price")
    assert attrs(tool_span)["gen_ai.operation.name"] == "execute_tool"
    assert attrs(tool_span)["gen_ai.tool.name"] == "lookup_price"
    assert chain_of(tool_span, spans)[0] == ("planner", "lookup_price")
    assert tool_span.parent.span_id == spans.one("invoke_agent planner").context.span_id


async def test_a_tool_running_its_own_agent_is_one_hop(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    """A tool named like the agent its body runs: one hop, not a false cycle."""
    otel_guard.configure(cycle_rule="agent")
    budget_agent = Agent(name="budget", model=LoopModel("budget", None, CallBudget(0)))

    @function_tool
    async def budget(input: str) -> str:
        """Ask the budget agent."""
        return str((await Runner.run(budget_agent, input)).final_output)

    planner = Agent(name="planner", tools=[budget], model=LoopModel("planner", "budget", CallBudget(1)))

    result = await Runner.run(planner, "Plan a trip to Lisbon.")

    assert result.final_output == "planner answers: budget answers on its own"
    assert spans.one("execute_tool budget")
    assert not spans.named("invoke_agent budget")


async def test_a_refusal_inside_a_tool_body_reaches_the_model(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    """A tool whose body runs a sub-agent that is refused: the model gets the refusal, not the
    SDK's generic "An error occurred while running the tool"."""
    otel_guard.configure(cycle_rule="agent")
    planner = Agent(name="planner", instructions="Plan.")

    @function_tool
    async def consult(input: str) -> str:
        """Ask a colleague."""
        return str((await Runner.run(planner, input)).final_output)

    planner.tools = [consult]
    planner.model = LoopModel("planner", "consult", CallBudget(5))

    result = await Runner.run(planner, "Plan a trip to Lisbon.")

    output = last_tool_output(planner.model)
    assert output.startswith(
        "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle: agent "
        "planner is already in chain planner → consult."
    )
    assert result.final_output == f"planner answers: {output}"
    assert attrs(spans.one("execute_tool consult"))["otel_guard.decision"] == "allow"


async def test_the_sdks_generic_failure_text_named_explicitly_is_replaced_too(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner = Agent(name="planner")

    @function_tool(failure_error_function=default_tool_error_function)
    async def consult(input: str) -> str:
        """Ask a colleague."""
        return str((await Runner.run(planner, input)).final_output)

    planner.tools = [consult]
    planner.model = LoopModel("planner", "consult", CallBudget(5))

    await Runner.run(planner, "Plan a trip to Lisbon.")

    assert last_tool_output(planner.model).startswith("Refused by otel-guard")


async def test_a_tools_own_failure_formatter_decides_what_the_model_sees(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner = Agent(name="planner")

    def formatter(context: RunContextWrapper[Any], error: Exception) -> str:
        return f"consult failed: {type(error).__name__}"

    @function_tool(failure_error_function=formatter)
    async def consult(input: str) -> str:
        """Ask a colleague."""
        return str((await Runner.run(planner, input)).final_output)

    planner.tools = [consult]
    planner.model = LoopModel("planner", "consult", CallBudget(5))

    await Runner.run(planner, "Plan a trip to Lisbon.")

    assert last_tool_output(planner.model) == "consult failed: DelegationRefused"


async def test_parallel_calls_of_one_tool_are_siblings_not_a_cycle(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[str] = []

    @function_tool
    def price(item: str) -> str:
        """Price one item."""
        seen.append(chain_agents())
        return f"{item}: 10 EUR"

    model = ScriptedModel(
        [
            [
                function_call("price", {"item": "hotel"}, call_id="a"),
                function_call("price", {"item": "flight"}, call_id="b"),
            ],
            [assistant_message("20 EUR in all")],
        ]
    )
    planner = Agent(name="planner", tools=[price], model=model)

    result = await Runner.run(planner, "What does it cost?")

    assert result.final_output == "20 EUR in all"
    assert seen == ["planner > price", "planner > price"]
    assert [attrs(s)["otel_guard.decision"] for s in spans.named("execute_tool price")] == [
        "allow",
        "allow",
    ]


async def test_a_tool_approved_after_an_interruption_runs_as_a_hop(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    @function_tool(needs_approval=True)
    def book(item: str) -> str:
        """Book something (needs approval)."""
        return f"booked {item} ({chain_agents()})"

    model = ScriptedModel(
        [
            [function_call("book", {"item": "hotel"}, call_id="a")],
            [assistant_message("Booked.")],
        ]
    )
    planner = Agent(name="planner", tools=[book], model=model)

    first = await Runner.run(planner, "Book a hotel.")
    assert [item.name for item in first.interruptions] == ["book"]
    assert not spans.named("execute_tool book")
    state = first.to_state()
    state.approve(first.interruptions[0])
    resumed = await Runner.run(planner, state)

    assert resumed.final_output == "Booked."
    assert model.calls[-1].input[-1]["output"] == "booked hotel (planner > book)"
    assert attrs(spans.one("execute_tool book"))["otel_guard.decision"] == "allow"


async def test_a_refused_tool_with_a_typed_output_still_returns_the_refusal(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    """A refusal is an SDK-generated error result: a tool's output schema does not reject it."""

    @function_tool(output_type=Quote)
    def quote(item: str) -> Quote:
        """Quote a price."""
        raise AssertionError("the refused tool's body must not run")

    planner = Agent(name="planner", tools=[quote])
    planner.model = LoopModel("planner", "quote", CallBudget(1))

    with otel_guard.delegate("quote", kind="tool"):
        result = await Runner.run(planner, "Quote a hotel.")

    assert str(result.final_output).startswith(
        "planner answers: Refused by otel-guard (a2a_delegation_cycle, reason: cycle)"
    )


async def test_invoke_function_tool_is_a_hop_too(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    """``agents.tool.invoke_function_tool`` is how realtime sessions call tools."""
    from agents.tool import invoke_function_tool
    from agents.tool_context import ToolContext

    @function_tool
    def price(item: str) -> str:
        """Price one item."""
        return f"{item}: 10 EUR ({chain_agents()})"

    arguments = '{"item": "hotel"}'
    context = ToolContext(context=None, tool_name="price", tool_call_id="call_1", tool_arguments=arguments)
    with otel_guard.delegate("voice"):
        output = await invoke_function_tool(function_tool=price, context=context, arguments=arguments)

    assert output == "hotel: 10 EUR (voice > price)"
    assert chain_of(spans.one("execute_tool price"), spans)[0] == ("voice", "price")
