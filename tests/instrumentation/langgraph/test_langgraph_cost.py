"""A tree's budget in money in LangChain / LangGraph (issue 44.4, 44.5), with a scripted chat model.

Planner (a graph) has the tool ``budget`` that runs the budget graph, which has the tool ``lookup``.
Every reply reports ``usage_metadata`` (1,000 input tokens, 400 of them read from the cache; 100
output) and names its model in ``response_metadata`` as ``ChatOpenAI`` does; at the ``prices``
file's 10 (input), 1 (cache read) and 100 (output) per million tokens a reply costs 600 * 10 + 400 +
100 * 100 = 16,400 micro-units.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph_app import Script, ScriptedToolModel, agent_tool

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.langgraph import LangGraphInstrumentor
from otel_guard.instrumentation.langgraph._usage import TreeBudgetExceeded
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(LangGraphInstrumentor)

PRICES = {"acme-*": {"input": 10, "output": 100, "cache_read": 1}}
PER_REPLY = 600 * 10 + 400 * 1 + 100 * 100


class PricedModel(ScriptedToolModel):
    """A scripted model whose every reply reports usage and names its model, as ``ChatOpenAI``'s do
    (and, given ``charged``, OpenRouter's ``usage.cost`` in its ``token_usage``)."""

    charged: float | None = None

    def _generate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        result = super()._generate(messages, stop, run_manager, **kwargs)
        message = result.generations[0].message
        assert isinstance(message, AIMessage)
        message.usage_metadata = {
            "input_tokens": 1000,
            "output_tokens": 100,
            "total_tokens": 1100,
            "input_token_details": {"cache_read": 400},
        }
        usage: dict[str, Any] = {"prompt_tokens": 1000, "completion_tokens": 100}
        if self.charged is not None:
            usage["cost"] = self.charged
        message.response_metadata = {"model_name": "acme-large-2025-01-01", "token_usage": usage}
        return result


def graph(name: str, model: Any, tools: Sequence[BaseTool]) -> Any:
    """langgraph_app's agent graph, with a checkpointer: its messages can be read after it fails."""
    bound = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", RunnableLambda(call_model, afunc=acall_model))
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(name=name, checkpointer=InMemorySaver())


def tree(charged: float | None = None) -> tuple[Any, Script]:
    script = Script(max_tool_calls=2)  # planner calls budget, budget calls lookup
    lookup = StructuredTool.from_function(func=lambda question: "42", name="lookup", description="Look up.")
    budget = graph("budget", PricedModel(agent="budget", script=script, charged=charged), [lookup])
    tool = agent_tool("budget", lambda: budget)
    planner = graph("planner", PricedModel(agent="planner", script=script, charged=charged), [tool])
    return planner, script


def run(planner: Any, thread: str) -> Any:
    return planner.invoke(
        {"messages": [HumanMessage("plan the offsite")]},
        {"configurable": {"thread_id": thread}, "recursion_limit": 50},
    )


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


def test_every_reply_of_the_tree_is_priced_by_the_model_it_names(instrumented: LangGraphInstrumentor) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, script = tree()
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        run(planner, "priced")
    # planner: the tool call and the answer; budget: the lookup call and the answer.
    assert script.runs == {"planner": 1, "budget": 1}
    assert spent(hop.chain.root) == 4 * PER_REPLY


def test_a_cost_the_provider_reported_comes_first(instrumented: LangGraphInstrumentor) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, _ = tree(charged=0.0005)
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        run(planner, "charged")
    assert spent(hop.chain.root) == 4 * 500


def test_a_budget_spent_in_a_sub_graph_reaches_the_caller_as_a_tool_error_and_the_run_ends(
    instrumented: LangGraphInstrumentor, spans: Any
) -> None:
    # planner's first reply 0.0164, budget's first 0.0328: lookup is then a refused hop, budget's
    # next request is refused inside its graph, and the planner's tool gets that as its error.
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    planner, _ = tree()
    started = time.monotonic()
    with pytest.raises(GraphRecursionError, match=r"has spent its 0\.03 USD \(max_cost 0\.03\)") as ended:
        run(planner, "spent")
    assert time.monotonic() - started < 20
    assert isinstance(ended.value, TreeBudgetExceeded)
    messages = planner.get_state({"configurable": {"thread_id": "spent"}}).values["messages"]
    [reply] = [m for m in messages if isinstance(m, ToolMessage) and m.name == "budget"]
    assert reply.status == "error"
    assert "has spent its 0.03 USD (max_cost 0.03); the model request is refused" in str(reply.content)
    [lookup] = spans.named("execute_tool lookup")
    assert lookup.attributes["otel_guard.budget.exhausted"] == "cost"
