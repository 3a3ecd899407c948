"""The fx service: a FastAPI app hosting the LangGraph agent ``fx``.

Asked for a rate, the fx agent answers on its own. Asked to check with the concierge, its model calls
its one tool, ``ask_concierge`` (a POST with requests, ``raise_for_status()`` as usual), and answers
with the rate and what came back. That call is the loop: the concierge is where the request began.
The agent is a small ``StateGraph`` (a model node and a ``ToolNode``) whose chat model is scripted: no
keys, no network beyond 127.0.0.1. The endpoint is a plain ``def``: FastAPI runs it on a worker thread.

``GuardMiddleware(agent="fx")`` makes each request one hop into the agent ``fx``; the graph run named
``fx`` inside it is that same hop.

Run by ``app.py`` (``uvicorn fx:app --app-dir examples/services``), which sets ``CONCIERGE_URL``.
"""

from __future__ import annotations

import os
from typing import Any

import requests
from fastapi import FastAPI
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

from otel_guard.asgi import GuardMiddleware

MAX_TOOL_CALLS = 3  # this service's script gives up after this many tool calls, whatever stops the loop
CALL_SECONDS = 60.0
RATE = "1 EUR = 1.08 USD"
tool_calls = 0


class ScriptedModel(BaseChatModel):
    """The scripted chat model: calls ``ask_concierge`` when the question asks for it, else answers."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        global tool_calls
        question, last = str(messages[0].content), messages[-1]
        if isinstance(last, ToolMessage):
            # A refused call comes back here as status="error", the refusal as its text.
            print(f"  fx got {last.name}'s {last.status} result: {str(last.content)[:200]}")
            said = (
                f"confirmed by {last.name}"
                if last.status == "success"
                else f"{last.name} failed: unconfirmed"
            )
            reply = AIMessage(f"fx: {RATE} ({said})")
        elif "concierge" in question and tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"fx calls ask_concierge (its tool call {tool_calls})")
            call = {"name": "ask_concierge", "args": {"question": question}, "id": f"call_{tool_calls}"}
            reply = AIMessage("", tool_calls=[call])
        else:
            print("fx answers on its own")
            reply = AIMessage(f"fx: {RATE}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def ask_concierge(question: str) -> str:
    """Ask the concierge service to confirm the plan."""
    reply = requests.post(
        f"{os.environ['CONCIERGE_URL']}/ask", json={"question": question}, timeout=CALL_SECONDS
    )
    reply.raise_for_status()
    return str(reply.json()["answer"])


def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [ScriptedModel().invoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("model", call_model)
builder.add_node("tools", ToolNode([ask_concierge]))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)  # to "tools" on a tool call, else the end
builder.add_edge("tools", "model")
fx = builder.compile(name="fx")  # the name is what the guard puts on the path


class Question(BaseModel):
    question: str


app = FastAPI()


@app.post("/ask")
def ask(body: Question) -> dict[str, str]:
    state = fx.invoke({"messages": [HumanMessage(body.question)]})
    return {"answer": str(state["messages"][-1].content)}


@app.get("/health")
def health() -> dict[str, object]:
    return {"status": "ok", "tool_calls": tool_calls}


app.add_middleware(GuardMiddleware, agent="fx")
