"""The concierge service: a FastAPI app hosting the pydantic-ai agent ``concierge``.

Asked to plan something, the concierge's model asks the pricing service what it costs (its one tool,
``ask_pricing``: a POST with httpx, ``raise_for_status()`` as usual) and answers with what came back.
The model is scripted (pydantic-ai's ``FunctionModel``): no keys, no network beyond 127.0.0.1.

``GuardMiddleware(agent="concierge")`` makes each request one hop into the agent ``concierge``, and the
agent run of that name inside it is that same hop: the service costs one place in the chain. A
refused request (a loop coming back here) is answered 409 and never reaches the agent.

Run by ``app.py`` (``uvicorn concierge:app --app-dir examples/services``), which sets ``PRICING_URL``.
"""

from __future__ import annotations

import os

import httpx
from fastapi import FastAPI
from pydantic import BaseModel
from pydantic_ai import Agent, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from otel_guard.asgi import GuardMiddleware

MAX_TOOL_CALLS = 3  # this service's script gives up after this many tool calls, whatever stops the loop
CALL_SECONDS = 60.0
tool_calls = 0


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The scripted model: ask pricing at the start of a run, then answer with what came back."""
    global tool_calls
    returned = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
    if returned:
        result = returned[0]
        print(f"  concierge got {result.tool_name}'s {result.outcome} result: {str(result.content)[:200]}")
        return ModelResponse(parts=[TextPart(f"concierge: {result.content}")])
    if tool_calls >= MAX_TOOL_CALLS:
        print("concierge: the script gives up")
        return ModelResponse(parts=[TextPart("concierge gives up")])
    tool_calls += 1
    # The user's question, passed on as it was asked.
    question = next(str(part.content) for part in messages[0].parts if isinstance(part, UserPromptPart))
    print(f"concierge calls ask_pricing (its tool call {tool_calls})")
    return ModelResponse(parts=[ToolCallPart("ask_pricing", {"question": question})])


async def ask_pricing(question: str) -> str:
    """Ask the pricing service what the plan costs."""
    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        reply = await client.post(f"{os.environ['PRICING_URL']}/ask", json={"question": question})
        reply.raise_for_status()
        return str(reply.json()["answer"])


concierge = Agent(FunctionModel(respond), name="concierge", tools=[Tool(ask_pricing)])


class Question(BaseModel):
    question: str


app = FastAPI()


@app.post("/ask")
async def ask(body: Question) -> dict[str, str]:
    return {"answer": (await concierge.run(body.question)).output}


@app.get("/health")
async def health() -> dict[str, object]:
    return {"status": "ok", "tool_calls": tool_calls}


app.add_middleware(GuardMiddleware, agent="concierge")
