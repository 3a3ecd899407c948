"""Two LangGraph agents that delegate to each other, driven by an offline scripted chat model.

``planner`` and ``budget`` are each a ``StateGraph`` (model node + ``ToolNode``) whose one tool is the
other agent: the classic delegation loop. The chat model binds tools like a real one and decides from
what it receives: a fresh question makes it call its first tool (while the shared script still
allows a tool call, which bounds the loop when nothing guards it); a tool's reply makes it answer
with that reply. Nothing here imports otel-guard: tests instrument it, and run as a program it is
what a user starts under ``opentelemetry-instrument``::

    opentelemetry-instrument python langgraph_app.py [--async]

which prints one line ``RESULT {json}``: the answer, the runs per agent and the messages each model
received from a tool.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition


class Script:
    """What the scripted models share: a bound on tool calls, and a log of what they saw."""

    def __init__(self, max_tool_calls: int) -> None:
        self.max_tool_calls = max_tool_calls
        self.tool_calls = 0
        self.runs: dict[str, int] = {}
        self.tool_replies: list[tuple[str, ToolMessage]] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def start_run(self, agent: str) -> None:
        with self._lock:
            self.runs[agent] = self.runs.get(agent, 0) + 1

    def take_tool_call(self) -> str | None:
        """A fresh tool call id, or ``None`` once the script's tool calls are used up."""
        with self._lock:
            if self.tool_calls >= self.max_tool_calls:
                return None
            self.tool_calls += 1
            return f"call_{next(self._ids)}"

    def saw_tool_reply(self, agent: str, message: ToolMessage) -> None:
        with self._lock:
            self.tool_replies.append((agent, message))


class ScriptedToolModel(BaseChatModel):
    """An offline chat model that binds tools and scripts its tool calls from what it receives.

    On a fresh question it calls its first tool, or with ``fan_out`` all its tools at once.
    """

    agent: str
    script: Script
    fan_out: bool = False

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-model"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, BaseMessage]:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        tools = kwargs.get("tools") or []
        if isinstance(last, ToolMessage):
            replies = list(itertools.takewhile(lambda m: isinstance(m, ToolMessage), messages[::-1]))
            said = []
            for message in reversed(replies):
                self.script.saw_tool_reply(self.agent, message)
                said.append(f"{message.name} said: {message.content}")
            reply = AIMessage(f"{self.agent} answers with what it has. {' '.join(said)}")
        else:
            self.script.start_run(self.agent)
            question = f"{self.agent} asks: {last.content}"
            calls = []
            for tool in tools if self.fan_out else tools[:1]:
                call_id = self.script.take_tool_call()
                if call_id is not None:
                    name = tool["function"]["name"]
                    calls.append({"name": name, "args": {"question": question}, "id": call_id})
            reply = (
                AIMessage("", tool_calls=calls) if calls else AIMessage(f"{self.agent} answers on its own.")
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


def agent_graph(name: str, model: BaseChatModel, tools: Sequence[BaseTool]) -> CompiledStateGraph:
    """A tool-calling agent: model node, ``ToolNode``, and back to the model until it answers."""
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
    return builder.compile(name=name)


def last_text(state: Any) -> str:
    message = state["messages"][-1]
    return str(message["content"] if isinstance(message, dict) else message.content)


def agent_tool(
    name: str, graph: Callable[[], Runnable[Any, Any]], *, tool_name: str | None = None
) -> BaseTool:
    """The agent ``name`` offered as a tool (named ``tool_name``, by default the agent's name)."""

    def ask(question: str) -> str:
        return last_text(graph().invoke({"messages": [HumanMessage(question)]}))

    async def aask(question: str) -> str:
        return last_text(await graph().ainvoke({"messages": [HumanMessage(question)]}))

    return StructuredTool.from_function(
        func=ask,
        coroutine=aask,
        name=tool_name or name,
        description=f"Ask the {name} agent a question.",
    )


AgentBuilder = Callable[[str, BaseChatModel, Sequence[BaseTool]], CompiledStateGraph]


def delegation_loop(
    script: Script,
    *,
    tool_names: dict[str, str] | None = None,
    build: AgentBuilder = agent_graph,
) -> dict[str, CompiledStateGraph]:
    """``planner`` with the tool ``budget`` (the budget agent) and ``budget`` with ``planner``."""
    graphs: dict[str, CompiledStateGraph] = {}
    names = tool_names or {}
    for agent, other in (("planner", "budget"), ("budget", "planner")):
        tool = agent_tool(other, lambda other=other: graphs[other], tool_name=names.get(other))
        graphs[agent] = build(agent, ScriptedToolModel(agent=agent, script=script), [tool])
    return graphs


def run(use_async: bool) -> dict[str, Any]:
    script = Script(max_tool_calls=6)
    planner = delegation_loop(script)["planner"]
    question = {"messages": [HumanMessage("Plan a three-day trip to Lisbon.")]}
    state = asyncio.run(planner.ainvoke(question)) if use_async else planner.invoke(question)
    return {
        "answer": last_text(state),
        "runs": script.runs,
        "tool_replies": [
            {"agent": agent, "tool": m.name, "status": m.status, "content": m.content}
            for agent, m in script.tool_replies
        ],
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(use_async="--async" in sys.argv[1:])), flush=True)
