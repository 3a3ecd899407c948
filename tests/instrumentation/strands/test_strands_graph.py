"""A Strands graph under otel-guard: each node's agent run is a hop, from the graph's context.

A graph's edges are orchestration, not delegation: the graph runs each node itself, so a node's run
stands in the chain in force where the graph runs (nothing of the node that ran before it), and the
node's own tool calls extend the node's chain.
"""

from __future__ import annotations

from typing import Any

from strands import Agent, tool
from strands.multiagent import GraphBuilder, Status
from strands_loop import CallBudget, ScriptedModel
from strands_support import decisions, instrumented_fixture

import otel_guard
from otel_guard.instrumentation.strands import StrandsInstrumentor

instrumented = instrumented_fixture()


async def test_each_node_run_is_a_hop_from_the_graph_and_its_tools_extend_it(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    @tool
    def price(question: str) -> str:
        """Price a plan."""
        return "1200 EUR"

    calls = CallBudget(1)
    planner = Agent(name="planner", model=ScriptedModel("planner", None, calls), callback_handler=None)
    budget = Agent(
        name="budget", model=ScriptedModel("budget", "price", calls), tools=[price], callback_handler=None
    )
    builder = GraphBuilder()
    builder.add_node(planner, "planner")
    builder.add_node(budget, "budget")
    builder.add_edge("planner", "budget")
    builder.set_max_node_executions(4)
    graph = builder.build()

    with otel_guard.delegate("coordinator"):
        result = await graph.invoke_async("Plan the team offsite")

    assert result.status == Status.COMPLETED
    assert decisions(spans) == [
        ("invoke_agent coordinator", "allow", ("coordinator",)),
        ("invoke_agent planner", "allow", ("coordinator", "planner")),
        ("invoke_agent budget", "allow", ("coordinator", "budget")),
        ("execute_tool price", "allow", ("coordinator", "budget", "price")),
    ]
