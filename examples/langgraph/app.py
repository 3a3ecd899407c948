"""Planner and budget: two LangGraph agents that ask each other, each with a scripted chat model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Here each agent is a small ``StateGraph`` (a model node and a ``ToolNode``) whose
chat model is scripted: it calls its tool whenever a run starts, and answers in text once a tool
message is back. The scripts stop after ``MAX_TOOL_CALLS`` tool calls, so that the program ends even
when nothing stops the loop.

Without the guard (``python examples/langgraph/app.py``) the agents bounce until the scripts give
up. Under the guard, with no change to this file::

    pip install '.[langgraph]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/langgraph/app.py

the budget agent's call back into the planner is refused (the planner is already on the path): its
tool call returns a ``ToolMessage`` with ``status="error"`` holding the refusal, the budget agent
answers with what it has, and so does the planner. The spans, the guard's among them, are printed
as JSON when the program ends.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0

AgentGraph = CompiledStateGraph[MessagesState, None, MessagesState, MessagesState]  # a compiled agent graph


class ScriptedModel(BaseChatModel):
    """A chat model that calls ``tool`` at the start of each run, then answers with what came back."""

    agent: str
    tool: str

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        global tool_calls
        last = messages[-1]
        if isinstance(last, ToolMessage):
            # Under the guard, a refused call comes back here as status="error" with the refusal as text.
            print(f"  {self.agent} got {last.name}'s {last.status} result: {str(last.content)[:160]}")
            reply = AIMessage(f"{self.agent}'s answer, from what {last.name} said")
        elif tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.tool} (tool call {tool_calls})")
            call = {
                "name": self.tool,
                "args": {"question": f"asked by {self.agent}"},
                "id": f"call_{tool_calls}",
            }
            reply = AIMessage("", tool_calls=[call])
        else:
            print(f"{self.agent}: the script gives up")
            reply = AIMessage(f"{self.agent} gives up")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def agent(name: str, model: BaseChatModel, tools: list[BaseTool]) -> AgentGraph:
    """A tool-calling agent: the model, then its tool calls, then the model again until it answers."""

    def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        # A real model would be bound to the tools (``model.bind_tools(tools)``); the script knows its tool.
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)  # to "tools" on a tool call, else the end
    builder.add_edge("tools", "model")
    # The name is what the guard puts on the path: a graph left unnamed is not taken for an agent.
    return builder.compile(name=name)


def answer(graph: AgentGraph, question: str) -> str:
    return str(graph.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content)


@tool
def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return answer(budget, question)


@tool
def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return answer(planner, question)


planner = agent("planner", ScriptedModel(agent="planner", tool="ask_budget"), [ask_budget])
budget = agent("budget", ScriptedModel(agent="budget", tool="ask_planner"), [ask_planner])


def main() -> None:
    final = answer(planner, "Plan the team offsite")
    print(f"planner's final answer: {final!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
