"""LangGraph handoffs: a handoff tool's ``Command(goto=agent, graph=Command.PARENT)`` is a transfer.

The agents are LangGraph's own multi-agent shape (its docs' handoff tools): each agent a named graph
(model node + ``ToolNode``) added as a node of one parent graph, and a handoff tool that returns
``Command(goto=<agent>, graph=Command.PARENT)``. The models are offline and scripted: each call takes
the next step of its agent's script (call a tool, or answer with the last tool reply).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Annotated, Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import InjectedState
from langgraph.types import Command
from langgraph_app import agent_graph, last_text
from opentelemetry.sdk.trace import ReadableSpan

import otel_guard
from otel_guard.instrumentation.langgraph import LangGraphInstrumentor
from otel_guard.instrumentation.langgraph._waiting import WAITING
from tests.hop_spans import chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(LangGraphInstrumentor)

_ids = itertools.count(1)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def create_handoff_tool(*, agent_name: str) -> BaseTool:
    """The LangGraph docs' handoff tool: control goes to ``agent_name`` in the parent graph."""
    name = f"transfer_to_{agent_name}"

    @tool(name, description=f"Transfer the user to {agent_name}.")
    def handoff_tool(
        state: Annotated[MessagesState, InjectedState], tool_call_id: Annotated[str, InjectedToolCallId]
    ) -> Command[Any]:
        tool_message = ToolMessage(
            f"Successfully transferred to {agent_name}", name=name, tool_call_id=tool_call_id
        )
        return Command(
            goto=agent_name, update={"messages": [*state["messages"], tool_message]}, graph=Command.PARENT
        )

    return handoff_tool


class StepsModel(BaseChatModel):
    """An offline chat model that plays its agent's script: each call takes the next step, a tool
    to call (``"call:<tool>"``, or ``"loop:<tool>"``: call it on every call from then on), else
    answers with the last tool reply it received."""

    agent: str
    steps: list[str]

    @property
    def _llm_type(self) -> str:
        return "steps-model"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        step = self.steps[0] if self.steps else "answer"
        if not step.startswith("loop:") and self.steps:
            self.steps.pop(0)
        last = messages[-1]
        if isinstance(last, ToolMessage) and last.status == "error":
            step = "answer"  # a refusal: the model reads it and answers
        if step == "answer":
            said = last.content if isinstance(last, ToolMessage) else "nothing"
            reply = AIMessage(f"{self.agent} answers: {said}")
        else:
            name = step.partition(":")[2]
            reply = AIMessage("", tool_calls=[{"name": name, "args": {}, "id": f"call_{next(_ids)}"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def team(
    scripts: dict[str, list[str]], handoffs: dict[str, list[str]], tools: dict[str, list[BaseTool]]
) -> CompiledStateGraph:
    """The agents as nodes of one (unnamed) parent graph, the first one its entry."""
    builder = StateGraph(MessagesState)
    for agent, steps in scripts.items():
        agent_tools = [
            *tools.get(agent, []),
            *(create_handoff_tool(agent_name=other) for other in handoffs[agent]),
        ]
        builder.add_node(agent_graph(agent, StepsModel(agent=agent, steps=steps), agent_tools))
    builder.add_edge(START, next(iter(scripts)))
    return builder.compile()


def chain_seen(seen: list[str]) -> BaseTool:
    def lookup() -> str:
        chain = otel_guard.current_chain()
        assert chain is not None
        seen.append(chain.path())
        return "one bag"

    return StructuredTool.from_function(func=lookup, name="lookup", description="Look the answer up.")


async def run(graph: CompiledStateGraph, use_async: bool) -> Any:
    question = {"messages": [HumanMessage("How many bags may I bring?")]}
    return await graph.ainvoke(question) if use_async else graph.invoke(question)


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
async def test_a_hand_back_to_triage_runs_in_one_chain_of_transfers(
    instrumented: LangGraphInstrumentor, spans: Any, use_async: bool
) -> None:
    seen: list[str] = []
    graph = team(
        {
            "triage": ["call:transfer_to_faq", "answer"],
            "faq": ["call:lookup", "call:transfer_to_triage"],
        },
        {"triage": ["faq"], "faq": ["triage"]},
        {"faq": [chain_seen(seen)]},
    )

    state = await run(graph, use_async)

    assert last_text(state) == "triage answers: Successfully transferred to triage"
    assert seen == ["triage ⇒ faq → lookup"]
    decisions = {attrs(s).get("otel_guard.decision") for s in spans.all()} - {None}
    assert decisions == {"allow"}
    first, back = sorted(spans.named("invoke_agent triage"), key=lambda s: s.start_time)
    faq = spans.one("invoke_agent faq")
    assert attrs(first)["otel_guard.hop.kind"] == "call"
    assert "gen_ai.transfer.mode" not in attrs(first)
    for span in (faq, back):
        assert attrs(span)["otel_guard.hop.kind"] == "transfer"
        assert attrs(span)["gen_ai.transfer.mode"] == "pass_control"
    assert chain_of(faq, spans)[0] == ("triage", "faq")
    assert chain_of(back, spans)[0] == ("triage", "faq", "triage")
    assert len({attrs(s)["otel_guard.chain.root"] for s in (first, faq, back)}) == 1
    # The handoff tools are calls of the agent that handed off; each transfer's span is its run's.
    handoff = spans.one("execute_tool transfer_to_faq")
    assert chain_of(handoff, spans)[0] == ("triage", "transfer_to_faq")
    assert faq.start_time >= handoff.end_time
    assert not WAITING


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
async def test_a_handoff_ping_pong_stops_at_max_name_depth_and_the_agent_in_charge_answers(
    instrumented: LangGraphInstrumentor, spans: Any, use_async: bool
) -> None:
    otel_guard.configure(max_name_depth=3)
    graph = team(
        {"triage": ["loop:transfer_to_faq"], "faq": ["loop:transfer_to_triage"]},
        {"triage": ["faq"], "faq": ["triage"]},
        {},
    )

    state = await run(graph, use_async)

    # triage, faq, triage, faq, triage, faq: the next handoff would make triage stand a fourth time.
    answer = last_text(state)
    assert answer.startswith(
        "faq answers: Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name "
        "depth: agent triage already stands 3 times in chain triage ⇒ faq ⇒ triage ⇒ faq ⇒ triage ⇒ faq; "
        "the limit (max_name_depth) is 3"
    )
    runs = [attrs(s) for s in spans.all() if s.name.startswith("invoke_agent")]
    assert sorted((a["otel_guard.chain.depth"], a["otel_guard.decision"]) for a in runs) == [
        (1, "allow"),
        (2, "allow"),
        (3, "allow"),
        (4, "allow"),
        (5, "allow"),
        (6, "allow"),
        (7, "refuse"),
    ]
    refused = next(a for a in runs if a["otel_guard.decision"] == "refuse")
    assert refused["otel_guard.hop.kind"] == "transfer"
    assert refused["otel_guard.reason"] == "name_depth"
    # The refusal was the handoff tool's own error: faq's model read it and answered.
    assert [s.status.status_code.name for s in spans.named("execute_tool transfer_to_triage")] == [
        "UNSET"
    ] * 3
    assert not WAITING


def test_with_the_default_limits_a_ping_pong_of_handoffs_stops_at_max_depth(
    instrumented: LangGraphInstrumentor, spans: Any
) -> None:
    graph = team(
        {"triage": ["loop:transfer_to_faq"], "faq": ["loop:transfer_to_triage"]},
        {"triage": ["faq"], "faq": ["triage"]},
        {},
    )

    state = graph.invoke({"messages": [HumanMessage("Hello")]}, {"recursion_limit": 100})

    assert last_text(state).startswith(
        "faq answers: Refused by otel-guard (a2a_delegation_depth, reason: depth)"
    )
    # Eight agents' runs fill the chain; faq's handoff tool, a call, would be a ninth place.
    assert [attrs(s)["otel_guard.decision"] for s in spans.all() if s.name.startswith("invoke_agent")] == [
        "allow"
    ] * 8
    refused = next(s for s in spans.all() if attrs(s).get("otel_guard.decision") == "refuse")
    assert (refused.name, attrs(refused)["otel_guard.chain.depth"]) == ("execute_tool transfer_to_triage", 9)


def test_without_the_guard_the_ping_pong_runs_until_langgraphs_own_limit(spans: Any) -> None:
    graph = team(
        {"triage": ["loop:transfer_to_faq"], "faq": ["loop:transfer_to_triage"]},
        {"triage": ["faq"], "faq": ["triage"]},
        {},
    )
    from langgraph.errors import GraphRecursionError

    with pytest.raises(GraphRecursionError):
        graph.invoke({"messages": [HumanMessage("Hello")]}, {"recursion_limit": 12})


def test_a_handoff_into_an_agent_that_still_waits_is_a_cycle(
    instrumented: LangGraphInstrumentor, spans: Any
) -> None:
    # triage asks faq as a tool (a call: triage waits); inside, faq's handoff tool hands to triage.
    inner = team(
        {"faq": ["call:transfer_to_triage"], "triage": ["answer"]},
        {"faq": ["triage"], "triage": []},
        {},
    )
    inner.name = "helpdesk"

    def ask_helpdesk() -> str:
        return last_text(inner.invoke({"messages": [HumanMessage("Bags?")]}))

    ask = StructuredTool.from_function(func=ask_helpdesk, name="helpdesk", description="Ask the helpdesk.")
    outer = agent_graph("triage", StepsModel(agent="triage", steps=["call:helpdesk", "answer"]), [ask])

    state = outer.invoke({"messages": [HumanMessage("How many bags?")]})

    assert "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)" in last_text(state)
    refused = next(s for s in spans.all() if attrs(s).get("otel_guard.decision") == "refuse")
    assert refused.name == "invoke_agent triage"
    assert attrs(refused)["otel_guard.hop.kind"] == "transfer"
    assert chain_of(refused, spans)[0] == ("triage", "helpdesk", "faq", "triage")


def test_a_handoff_nobody_runs_ends_with_the_graph_that_received_it(
    instrumented: LangGraphInstrumentor, spans: Any
) -> None:
    # The target is a plain function node, not an agent's graph: its transfer ends with the run.
    builder = StateGraph(MessagesState)
    builder.add_node(
        agent_graph(
            "triage",
            StepsModel(agent="triage", steps=["call:transfer_to_human"]),
            [create_handoff_tool(agent_name="human")],
        )
    )
    builder.add_node("human", lambda state: {"messages": [AIMessage("a human answers")]})
    builder.add_edge(START, "triage")

    state = builder.compile().invoke({"messages": [HumanMessage("Hello")]})

    assert last_text(state) == "a human answers"
    human = spans.one("invoke_agent human")
    assert attrs(human)["otel_guard.hop.kind"] == "transfer"
    assert chain_of(human, spans)[0] == ("triage", "human")
    assert not WAITING


def test_an_unnamed_graph_alone_makes_no_hop(instrumented: LangGraphInstrumentor, spans: Any) -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("echo", lambda state: {"messages": [AIMessage("echo")]})
    builder.add_edge(START, "echo")
    chunks = list(builder.compile().stream({"messages": [HumanMessage("Hello")]}))
    assert chunks
    assert spans.all() == []
    assert (
        asyncio.run(builder.compile().ainvoke({"messages": [HumanMessage("Hello")]}))["messages"][-1].content
        == "echo"
    )
