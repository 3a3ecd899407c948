"""A graph run or a tool awaited on the event loop awaits its hop's budget store: a paused Redis never
holds the loop.

``astream`` (and ``ainvoke`` and ``astream_events``, which run through it) decides the run's hop at
the stream's first step, and ``BaseTool.arun`` its tool hop before the tool runs; with
``budget_store=redis://...`` each is one Redis round trip, awaited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

import otel_guard
from otel_guard import DelegationRefused
from otel_guard.instrumentation.langgraph import LangGraphInstrumentor
from tests.core.redis_server import paused_under_probe, running_redis
from tests.instrumentation.instrumentors import instrumentor_fixture

pytestmark = pytest.mark.integration

QUESTION = {"messages": [HumanMessage("Plan a three-day trip to Lisbon.")]}

instrumented = instrumentor_fixture(LangGraphInstrumentor)


def planner() -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("answer", lambda state: {"messages": [AIMessage("3 days in Lisbon")]})
    builder.add_edge(START, "answer")
    builder.add_edge("answer", END)
    return builder.compile(name="planner")


async def run(graph: Any, how: str) -> str:
    """The graph's answer, run the way ``how`` names."""
    if how == "ainvoke":
        state = await graph.ainvoke(QUESTION)
    elif how == "astream":
        state = [chunk async for chunk in graph.astream(QUESTION, stream_mode="values")][-1]
    else:
        ends = [e async for e in graph.astream_events(QUESTION, version="v2") if e["event"] == "on_chain_end"]
        state = ends[-1]["data"]["output"]
    return str(state["messages"][-1].content)


@pytest.mark.parametrize("how", ["ainvoke", "astream", "astream_events"])
@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_graph_run_awaits_a_redis_that_does_not_answer(
    instrumented: Any, spans: Any, tmp_path: Path, how: str, on_error: str
) -> None:
    graph = planner()
    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        assert await run(graph, how) == "3 days in Lisbon"  # the store's clients are connected
        async with paused_under_probe(redis) as probe:
            if on_error == "allow":
                answer = await run(graph, how)
            else:
                with pytest.raises(DelegationRefused) as refused:
                    await run(graph, how)
    probe.assert_the_hop_waited_not_the_loop()
    hops = [dict(s.attributes or {}) for s in spans.named("invoke_agent planner")]
    if on_error == "allow":
        assert answer == "3 days in Lisbon"
        assert [h["otel_guard.decision"] for h in hops] == ["allow", "allow"]
    else:
        assert refused.value.reason == "budget"
        assert [h["otel_guard.decision"] for h in hops] == ["allow", "refuse"]


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_tool_awaited_on_the_loop_awaits_a_redis_that_does_not_answer(
    instrumented: Any, spans: Any, tmp_path: Path, on_error: str
) -> None:
    @tool
    async def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        assert await lookup.ainvoke({"city": "Lisbon"}) == "Lisbon: sunny"  # the clients are connected
        async with paused_under_probe(redis) as probe:
            answer = await lookup.ainvoke({"city": "Lisbon"})
    probe.assert_the_hop_waited_not_the_loop()
    hops = [dict(s.attributes or {}) for s in spans.named("execute_tool lookup")]
    if on_error == "allow":
        assert answer == "Lisbon: sunny"
        assert [h["otel_guard.decision"] for h in hops] == ["allow", "allow"]
    else:
        assert "budget" in str(answer)  # the refusal is the tool's answer, not an exception
        assert [h["otel_guard.decision"] for h in hops] == ["allow", "refuse"]
