"""LangGraph under otel-guard: real graphs, real ToolNode, an offline scripted chat model.

The agents are in ``langgraph_app.py``: ``planner`` and ``budget`` each offer the other as a tool, so
without a guard they bounce until the script's tool calls run out.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph_app import Script, ScriptedToolModel, agent_graph, agent_tool, delegation_loop
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan

import otel_guard
from otel_guard.guard import Delegation
from otel_guard.instrumentation._base import refusal_text, resolve
from otel_guard.instrumentation.langgraph import PATCH_TARGETS, LangGraphInstrumentor
from otel_guard.instrumentation.langgraph._waiting import WAITING
from tests.hop_spans import chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

QUESTION = {"messages": [HumanMessage("Plan a three-day trip to Lisbon.")]}
REFUSAL_START = "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)"


instrumented = instrumentor_fixture(LangGraphInstrumentor)


def guard_spans(spans: Any) -> list[ReadableSpan]:
    return [s for s in spans.all() if s.name.split(" ")[0] in ("invoke_agent", "execute_tool")]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def decisions(metric_reader: Any, decision: str, tool: str) -> int:
    total = 0
    for attributes, point in metric_reader.points("otel_guard.decisions"):
        if attributes.get("otel_guard.decision") == decision and (attributes.get("gen_ai.tool.name") == tool):
            total += point.value  # type: ignore[attr-defined]
    return total


# -- the loop, stopped ----------------------------------------------------------------------------


def assert_stopped_at_first_bounce(script: Script, state: dict[str, Any]) -> None:
    # The refused hop's body never ran: planner ran once, budget once.
    assert script.runs == {"planner": 1, "budget": 1}
    # The budget model received the refusal as the planner tool's error message ...
    (agent, reply), *rest = script.tool_replies
    assert agent == "budget"
    assert isinstance(reply, ToolMessage)
    assert reply.name == "planner"
    assert reply.status == "error"
    assert reply.content.startswith(REFUSAL_START)
    assert "planner is already in chain planner → budget" in reply.content
    assert "do not call it again" in reply.content
    # ... answered with it, and the planner answered with budget's answer: the run completed.
    assert [(a, m.name, m.status) for a, m in rest] == [("planner", "budget", "success")]
    answer = state["messages"][-1].content
    assert answer.startswith("planner answers with what it has. budget said: budget answers")
    assert REFUSAL_START in answer


def react_agent(name: str, model: Any, tools: Any) -> Any:
    """The prebuilt agent (deprecated in LangGraph 1.x for langchain's, still widely used)."""
    from langgraph.prebuilt import create_react_agent

    return create_react_agent(model, tools, name=name)


@pytest.mark.parametrize("build", [agent_graph, react_agent], ids=["StateGraph", "react_agent"])
def test_loop_is_stopped_at_the_first_bounce(instrumented: Any, spans: Any, build: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=6)
    state = delegation_loop(script, build=build)["planner"].invoke(QUESTION)
    assert_stopped_at_first_bounce(script, state)


async def test_async_loop_is_stopped_at_the_first_bounce(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=6)
    state = await delegation_loop(script)["planner"].ainvoke(QUESTION)
    assert_stopped_at_first_bounce(script, state)
    assert [s.name for s in guard_spans(spans)] == [
        "execute_tool planner",
        "execute_tool budget",
        "invoke_agent planner",
    ]


def test_spans_carry_the_contract_attributes(instrumented: Any, spans: Any, metric_reader: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    refused_before = decisions(metric_reader, "refuse", "planner")
    delegation_loop(Script(max_tool_calls=6))["planner"].invoke(
        QUESTION, {"configurable": {"thread_id": "t-42"}}
    )
    # One span per hop: the budget graph run by the tool "budget" is that tool's hop, not another.
    assert [s.name for s in guard_spans(spans)] == [
        "execute_tool planner",
        "execute_tool budget",
        "invoke_agent planner",
    ]
    planner = spans.one("invoke_agent planner")
    budget = spans.one("execute_tool budget")
    refused = spans.one("execute_tool planner")
    assert planner.kind is trace.SpanKind.INTERNAL

    root = attrs(planner)["otel_guard.chain.root"]
    assert len(root) == 32
    assert attrs(planner) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "planner",
        "gen_ai.conversation.id": "t-42",
        "otel_guard.chain.agents": ("planner",),
        "otel_guard.chain.skills": ("",),
        "otel_guard.chain.root": root,
        "otel_guard.chain.depth": 1,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 1,
    }
    budget_attrs = attrs(budget)
    assert budget_attrs["gen_ai.operation.name"] == "execute_tool"
    assert budget_attrs["gen_ai.tool.name"] == "budget"
    assert budget_attrs["gen_ai.tool.call.id"].startswith("call_")
    assert "otel_guard.chain.agents" not in budget_attrs  # directly under planner's span: lean
    assert chain_of(budget, spans)[0] == ("planner", "budget")
    assert budget_attrs["otel_guard.chain.depth"] == 2
    assert budget_attrs["otel_guard.chain.root"] == root
    assert budget_attrs["otel_guard.decision"] == "allow"

    refused_attrs = attrs(refused)
    assert refused_attrs["otel_guard.chain.agents"] == ("planner", "budget", "planner")
    assert refused_attrs["otel_guard.chain.depth"] == 3
    assert refused_attrs["otel_guard.name_depth"] == 2
    assert refused_attrs["otel_guard.chain.root"] == root
    assert refused_attrs["otel_guard.decision"] == "refuse"
    assert refused_attrs["otel_guard.reason"] == "cycle"
    (event,) = refused.events
    assert event.name == "otel_guard.refused"
    assert dict(event.attributes or {})["otel_guard.reason"] == "cycle"

    # One trace, each hop the child of the one that delegated it.
    assert budget.parent is not None
    assert budget.parent.span_id == planner.context.span_id
    assert refused.parent is not None
    assert refused.parent.span_id == budget.context.span_id
    assert {s.context.trace_id for s in (planner, budget, refused)} == {planner.context.trace_id}
    assert decisions(metric_reader, "refuse", "planner") == refused_before + 1


def test_observe_mode_lets_the_loop_through_and_records_would_refuse(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    script = Script(max_tool_calls=3)
    state = delegation_loop(script)["planner"].invoke(QUESTION)
    # Nothing refused: planner ran again inside budget, bounded only by the script.
    assert script.runs == {"planner": 2, "budget": 2}
    assert all(m.status == "success" for _, m in script.tool_replies)
    assert state["messages"][-1].content.startswith("planner answers with what it has.")
    would = [s for s in guard_spans(spans) if attrs(s)["otel_guard.decision"] == "would_refuse"]
    assert [s.name for s in would] == ["execute_tool budget", "execute_tool planner"]
    assert [attrs(s)["otel_guard.chain.agents"] for s in would] == [
        ("planner", "budget", "planner", "budget"),
        ("planner", "budget", "planner"),
    ]
    for span in would:
        assert attrs(span)["otel_guard.reason"] == "cycle"
        assert attrs(span)["otel_guard.mode"] == "observe"
        assert [e.name for e in span.events] == ["otel_guard.would_refuse"]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_parallel_tool_calls_are_sibling_hops(instrumented: Any, spans: Any, mode: str) -> None:
    # ToolNode runs the two calls at once (threads, or tasks): each is its own branch of the chain,
    # never taken for recursion.
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=2)
    leaves = {
        name: agent_graph(name, ScriptedToolModel(agent=name, script=script), [])
        for name in ("budget", "weather")
    }
    tools = [agent_tool(name, lambda name=name: leaves[name]) for name in leaves]
    planner_model = ScriptedToolModel(agent="planner", script=script, fan_out=True)
    planner = agent_graph("planner", planner_model, tools)
    if mode == "sync":
        planner.invoke(QUESTION)
    else:
        await planner.ainvoke(QUESTION)
    assert script.runs == {"planner": 1, "budget": 1, "weather": 1}
    assert sorted((m.name, m.status) for _, m in script.tool_replies) == [
        ("budget", "success"),
        ("weather", "success"),
    ]
    top = spans.one("invoke_agent planner")
    for name in ("budget", "weather"):
        tool_span = spans.one(f"execute_tool {name}")
        assert chain_of(tool_span, spans)[0] == ("planner", name)
        assert attrs(tool_span)["otel_guard.decision"] == "allow"
        assert tool_span.parent is not None
        assert tool_span.parent.span_id == top.context.span_id


def test_a_refusal_inside_a_tool_reaches_the_model_as_that_tools_error(instrumented: Any, spans: Any) -> None:
    # Tools named apart from the agents: the refused hop is the planner *graph*, run by the tool
    # ask_planner; the refusal raised inside that tool still comes back as its ToolMessage.
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=6)
    graphs = delegation_loop(script, tool_names={"planner": "ask_planner", "budget": "ask_budget"})
    state = graphs["planner"].invoke(QUESTION)
    assert script.runs == {"planner": 1, "budget": 1}
    (agent, reply), _ = script.tool_replies
    assert (agent, reply.name, reply.status) == ("budget", "ask_planner", "error")
    assert "planner is already in chain planner → ask_budget → budget → ask_planner" in reply.content
    assert state["messages"][-1].content.startswith("planner answers with what it has.")
    refused = [s for s in guard_spans(spans) if attrs(s)["otel_guard.decision"] == "refuse"]
    assert [s.name for s in refused] == ["invoke_agent planner"]


def test_a_refused_direct_tool_call_returns_the_refusal_text(instrumented: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    tool = agent_tool("planner", lambda: pytest.fail("the refused tool's body ran"))
    with (
        otel_guard.delegate("planner"),
        pytest.raises(otel_guard.DelegationRefused) as err,
        otel_guard.delegate("planner"),
    ):
        pass  # the second hop into planner is refused on entry
    with otel_guard.delegate("planner"):
        result = tool.invoke({"question": "again?"})
    # Called without a tool call id (not by a model), the tool returns the refusal's text.
    assert result == refusal_text(err.value)
    assert result.startswith(REFUSAL_START)
    with otel_guard.delegate("planner"):
        message = tool.invoke(
            {"type": "tool_call", "name": "planner", "args": {"question": "?"}, "id": "call_9"}
        )
    assert isinstance(message, ToolMessage)
    assert (message.tool_call_id, message.status) == ("call_9", "error")


def _hops_left_to_the_collector(run: Any) -> list[Delegation]:
    """The hops that ``run()`` left in reference cycles: freed only by the garbage collector."""
    gc.collect()
    gc.disable()
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, Delegation)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_a_finished_run_leaves_no_hop_to_the_garbage_collector(instrumented: Any, spans: Any) -> None:
    # A hop whose context held the hop (the entry that waits for its LangChain run) was a reference
    # cycle: every graph run and tool call left its span, attributes and chain to the collector.
    script = Script(max_tool_calls=1)
    budget = agent_graph("budget", ScriptedToolModel(agent="budget", script=script), [])
    tool = agent_tool("budget", lambda: budget, tool_name="ask_budget")
    graph = agent_graph("planner", ScriptedToolModel(agent="planner", script=script), [tool])
    assert _hops_left_to_the_collector(lambda: graph.invoke(QUESTION)) == []
    assert [s.name for s in guard_spans(spans)] == [
        "invoke_agent budget",
        "execute_tool ask_budget",
        "invoke_agent planner",
    ]


async def test_no_hop_is_left_waiting_for_its_run(instrumented: Any, spans: Any) -> None:
    # A decided hop waits (in WAITING) until its run begins, and every run-start callback reads it
    # first: a hop left there would slow every later run and keep its span alive.
    otel_guard.configure(cycle_rule="agent")
    inside: list[int] = []

    def lookup() -> Any:
        inside.append(len(WAITING))  # the tool's hop opened when its run began
        raise RuntimeError("lookup failed")

    failing = agent_tool("lookup", lookup)
    with pytest.raises(RuntimeError, match="lookup failed"):
        failing.invoke({"question": "?"})
    assert inside == [0]
    delegation_loop(Script(max_tool_calls=6))["planner"].invoke(QUESTION)  # refused on entry
    await delegation_loop(Script(max_tool_calls=6))["planner"].ainvoke(QUESTION)
    graphs = delegation_loop(
        Script(max_tool_calls=6), tool_names={"planner": "ask_planner", "budget": "ask_budget"}
    )
    graphs["planner"].invoke(QUESTION)  # refused inside a tool
    stream = delegation_loop(Script(max_tool_calls=6))["planner"].stream(QUESTION, stream_mode="updates")
    next(stream)
    stream.close()  # left early
    assert not WAITING
    assert any(attrs(s)["otel_guard.decision"] == "refuse" for s in guard_spans(spans))


def test_a_graph_run_inside_a_hop_of_its_own_name_joins_it(instrumented: Any, spans: Any) -> None:
    # An agent implemented by a graph of the same name (@agentic here; an A2A or MCP server
    # elsewhere) is one hop, not a cycle.
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=0)
    graph = agent_graph("budget", ScriptedToolModel(agent="budget", script=script), [])

    @otel_guard.agentic(name="budget")
    def budget_agent() -> str:
        return str(graph.invoke(QUESTION)["messages"][-1].content)

    assert budget_agent() == "budget answers on its own."
    assert [s.name for s in guard_spans(spans)] == ["invoke_agent budget"]


def test_a_graph_that_runs_itself_again_is_refused(instrumented: Any, spans: Any) -> None:
    runs = []

    def again(state: MessagesState) -> dict[str, Any]:
        runs.append(len(state["messages"]))
        return graph.invoke(state)  # type: ignore[no-any-return]

    builder = StateGraph(MessagesState)
    builder.add_node("again", again)
    builder.add_edge(START, "again")
    builder.add_edge("again", END)
    graph = builder.compile(name="recursive")
    with pytest.raises(otel_guard.DelegationRefused) as refused:
        graph.invoke(QUESTION)
    assert refused.value.reason == "cycle"
    assert runs == [1]
    assert [attrs(s)["otel_guard.decision"] for s in guard_spans(spans)] == ["refuse", "allow"]


def _recursive(node: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("again", node)
    builder.add_edge(START, "again")
    builder.add_edge("again", END)
    return builder.compile(name="recursive")


def test_a_graph_that_streams_itself_inside_its_invoke_is_refused(instrumented: Any, spans: Any) -> None:
    # invoke is the hop, and the stream it runs is let through as inside it: only that one stream.
    # The same graph's stream started by one of its nodes is a new run, a hop of its own.
    runs = []

    def again(state: MessagesState) -> dict[str, Any]:
        runs.append(len(state["messages"]))
        return list(graph.stream(state, stream_mode="values"))[-1]  # type: ignore[no-any-return]

    graph = _recursive(again)
    with pytest.raises(otel_guard.DelegationRefused) as refused:
        graph.invoke(QUESTION)
    assert refused.value.reason == "cycle"
    assert runs == [1]
    assert [attrs(s)["otel_guard.decision"] for s in guard_spans(spans)] == ["refuse", "allow"]


async def test_a_graph_that_astreams_itself_inside_its_ainvoke_is_refused(
    instrumented: Any, spans: Any
) -> None:
    runs = []

    async def again(state: MessagesState) -> dict[str, Any]:
        runs.append(len(state["messages"]))
        return [chunk async for chunk in graph.astream(state, stream_mode="values")][-1]  # type: ignore[no-any-return]

    graph = _recursive(again)
    with pytest.raises(otel_guard.DelegationRefused) as refused:
        await graph.ainvoke(QUESTION)
    assert refused.value.reason == "cycle"
    assert runs == [1]
    assert [attrs(s)["otel_guard.decision"] for s in guard_spans(spans)] == ["refuse", "allow"]


@pytest.mark.parametrize("fails", [False, True], ids=["returns", "raises"])
def test_invoke_restores_the_context_it_was_called_in(instrumented: Any, spans: Any, fails: bool) -> None:
    # invoke's hop is attached once around the call, and the hop's span inside it when the graph's
    # run begins: both are gone when invoke returns or raises.
    def reply(state: MessagesState) -> dict[str, Any]:
        assert otel_guard.current_chain() is not None
        assert trace.get_current_span().name == "invoke_agent replier"  # type: ignore[attr-defined]
        if fails:
            raise ValueError("the node failed")
        return {"messages": [HumanMessage("done")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    graph = builder.compile(name="replier")
    outside = trace.get_current_span()
    if fails:
        with pytest.raises(ValueError, match="the node failed"):
            graph.invoke(QUESTION)
    else:
        assert graph.invoke(QUESTION)["messages"][-1].content == "done"
    assert trace.get_current_span() is outside
    assert otel_guard.current_chain() is None
    (span,) = guard_spans(spans)
    assert span.end_time is not None
    assert (span.status.status_code.name == "ERROR") is fails


def test_unnamed_graphs_make_no_hop(instrumented: Any, spans: Any) -> None:
    # LangGraph names every graph compiled without a name "LangGraph": an unnamed subgraph inside an
    # unnamed graph is not an agent calling itself.
    otel_guard.configure(cycle_rule="agent")
    inner_builder = StateGraph(MessagesState)
    inner_builder.add_node("reply", lambda state: {"messages": [HumanMessage("inner")]})
    inner_builder.add_edge(START, "reply")
    inner = inner_builder.compile()
    outer_builder = StateGraph(MessagesState)
    outer_builder.add_node("inner", inner)
    outer_builder.add_edge(START, "inner")
    outer = outer_builder.compile()
    assert outer.invoke(QUESTION)["messages"][-1].content == "inner"
    assert guard_spans(spans) == []


def test_a_stream_left_early_ends_its_hop_and_restores_the_context(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner = delegation_loop(Script(max_tool_calls=6))["planner"]
    outside = trace.get_current_span()
    stream = planner.stream(QUESTION, stream_mode="updates")
    first = next(stream)
    assert "model" in first
    # Between chunks the consumer is back in its own context.
    assert trace.get_current_span() is outside
    assert otel_guard.current_chain() is None
    stream.close()
    (span,) = guard_spans(spans)
    assert span.name == "invoke_agent planner"
    assert span.end_time is not None


async def test_an_async_stream_left_early_ends_its_hop(instrumented: Any, spans: Any) -> None:
    planner = delegation_loop(Script(max_tool_calls=6))["planner"]
    stream = planner.astream(QUESTION, stream_mode="updates")
    assert "model" in await anext(stream)
    assert otel_guard.current_chain() is None
    await stream.aclose()
    assert [s.name for s in guard_spans(spans)] == ["invoke_agent planner"]


# -- suppression and uninstrument -----------------------------------------------------------------


def test_suppressed_instrumentation_makes_no_hop(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=3)
    with suppress_instrumentation():
        delegation_loop(script)["planner"].invoke(QUESTION)
    assert script.runs == {"planner": 2, "budget": 2}
    assert guard_spans(spans) == []


def test_uninstrument_restores_langgraph(spans: Any) -> None:
    originals = [resolve(target) for target in PATCH_TARGETS]
    instrumentor = LangGraphInstrumentor()
    instrumentor.instrument()
    assert all(hasattr(resolve(t), "__wrapped__") for t in PATCH_TARGETS)
    instrumentor.uninstrument()
    assert [resolve(target) for target in PATCH_TARGETS] == originals
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=3)
    delegation_loop(script)["planner"].invoke(QUESTION)
    # Unguarded, the loop runs until the scripted model stops calling tools.
    assert script.runs == {"planner": 2, "budget": 2}
    assert guard_spans(spans) == []


def test_every_patch_target_exists_in_the_installed_versions() -> None:
    for target in PATCH_TARGETS:
        assert callable(resolve(target)), target
