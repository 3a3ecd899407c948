"""The pricing service: a FastAPI app hosting the OpenAI Agents SDK agent ``pricing``.

Asked what something costs, the pricing agent's model asks the fx service for the exchange rate (its
one function tool, ``ask_fx``: a POST with httpx) and answers with what came back. The model is
scripted (the SDK's ``agents.testing.ScriptedModel``, a fresh script for each request): no API key, no
network beyond 127.0.0.1.

``GuardMiddleware(agent="pricing")`` makes each request one hop into the agent ``pricing``; the SDK's
run of the agent of that name inside it is that same hop.

Run by ``app.py`` (``uvicorn pricing:app --app-dir examples/services``), which sets ``FX_URL``.
"""

from __future__ import annotations

import os

import httpx
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from fastapi import FastAPI
from pydantic import BaseModel

from otel_guard.asgi import GuardMiddleware

MAX_TOOL_CALLS = 3  # this service's script gives up after this many tool calls, whatever stops the loop
CALL_SECONDS = 60.0
tool_calls = 0

# The SDK's own tracing exports to the OpenAI dashboard, which needs an API key: off. The guard's
# spans are OpenTelemetry's, and do not depend on it.
set_tracing_disabled(True)


def respond(call: ModelCall) -> list[TResponseOutputItem]:
    """The scripted model: ask fx at the start of a run, then answer with what came back."""
    global tool_calls
    first, last = (call.input[0], call.input[-1]) if isinstance(call.input, list) else ({}, {})
    if last.get("type") == "function_call_output":
        print(f"  pricing got ask_fx's result: {str(last['output'])[:200]}")
        return [assistant_message(f"pricing: {last['output']}")]
    if tool_calls >= MAX_TOOL_CALLS:
        print("pricing: the script gives up")
        return [assistant_message("pricing gives up")]
    tool_calls += 1
    print(f"pricing calls ask_fx (its tool call {tool_calls})")
    question = str(first.get("content") or call.input)  # the user's question, passed on as it was asked
    return [function_call("ask_fx", {"question": question}, call_id=f"call_{tool_calls}")]


@function_tool
async def ask_fx(question: str) -> str:
    """Ask the fx service for the exchange rate."""
    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        reply = await client.post(f"{os.environ['FX_URL']}/ask", json={"question": question})
        reply.raise_for_status()
        return str(reply.json()["answer"])


pricing = Agent(name="pricing", instructions="Price the plan.", tools=[ask_fx])


class Question(BaseModel):
    question: str


app = FastAPI()


@app.post("/ask")
async def ask(body: Question) -> dict[str, str]:
    # A run makes at most two model calls (the tool call, then the answer): a script of two steps.
    script = ScriptedModel([ModelStep.respond(respond), ModelStep.respond(respond)])
    result = await Runner.run(pricing.clone(model=script), body.question)
    return {"answer": str(result.final_output)}


@app.get("/health")
async def health() -> dict[str, object]:
    return {"status": "ok", "tool_calls": tool_calls}


app.add_middleware(GuardMiddleware, agent="pricing")
