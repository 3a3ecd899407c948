"""Planner and budget: two plain HTTP agents that ask each other, each a Starlette app on uvicorn.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With real models, that is the loop that
burns money. Here each agent is scripted: asked anything, it asks the other agent (a POST with httpx,
its tool call), and answers with what came back. The scripts stop after ``MAX_TOOL_CALLS`` tool
calls, so that the program ends even when nothing stops the loop. Both servers listen on 127.0.0.1
(ephemeral ports) and are started and stopped by this program.

Each agent is wrapped in ``GuardMiddleware(app, agent=...)``, and each call carries the current
OpenTelemetry context (the chain rides in W3C baggage). The middleware is this program's own code, so
``python examples/asgi/app.py --without-guard`` leaves it out, and the agents bounce until the
scripts give up. With it (the OpenTelemetry API alone is enough to carry the chain; an SDK records the
spans)::

    pip install '.[asgi]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/asgi/app.py

the budget agent's call back into the planner is refused (the planner is already on the path) with
``409 Conflict``, which otel-guard's httpx instrumentation raises in the budget agent as
``DelegationRefused``; the budget agent reads the refusal and answers with what it has, and so does
the planner. The spans, the guard's among them, are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import httpx
import uvicorn
from opentelemetry import propagate
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from otel_guard import DelegationRefused
from otel_guard.asgi import GuardMiddleware

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
CALL_SECONDS = 10.0
tool_calls = 0
urls: dict[str, str] = {}  # agent -> its base URL, known once its socket is bound


def scripted(agent: str, other: str) -> Starlette:
    """An agent that asks ``other`` whenever it is asked, then answers with what came back."""

    async def ask(request: Request) -> JSONResponse:
        global tool_calls
        if tool_calls >= MAX_TOOL_CALLS:
            print(f"{agent}: the script gives up")
            return JSONResponse({"answer": f"{agent} gives up"})
        tool_calls += 1
        print(f"{agent} calls {other} (tool call {tool_calls})")
        headers: dict[str, str] = {}
        propagate.inject(headers)  # the hop's context, the chain in its baggage: what the guard reads
        try:
            async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
                reply = await client.post(f"{urls[other]}/ask", json={"question": agent}, headers=headers)
        except DelegationRefused as refusal:
            # The other agent's guard refused the call: its 409, raised here by otel-guard's httpx
            # instrumentation (under opentelemetry-instrument). Retrying would be refused again, so the
            # agent answers with what it has, as it does with a real reply.
            print(f"  {agent} got {other}'s 409 reply: {str(refusal)[:160]}")
            return JSONResponse({"answer": f"{agent}'s answer, from what it had"})
        # Without the httpx instrumentation, a refusal is the 409 itself, whose JSON says why.
        body: dict[str, Any] = reply.json()
        said = body.get("answer") or body.get("message")
        print(f"  {agent} got {other}'s {reply.status_code} reply: {str(said)[:160]}")
        return JSONResponse({"answer": f"{agent}'s answer, from what {other} said"})

    return Starlette(routes=[Route("/ask", ask, methods=["POST"])])


def agent_app(agent: str, other: str, guarded: bool) -> Starlette | GuardMiddleware:
    app = scripted(agent, other)
    return GuardMiddleware(app, agent=agent) if guarded else app


async def main(guarded: bool) -> None:
    servers: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []
    try:
        for agent, other in (("planner", "budget"), ("budget", "planner")):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))  # an ephemeral port, bound first so the other agent knows it
            urls[agent] = f"http://127.0.0.1:{sock.getsockname()[1]}"
            config = uvicorn.Config(agent_app(agent, other, guarded), log_level="warning", lifespan="off")
            server = uvicorn.Server(config)
            servers.append((server, asyncio.create_task(server.serve(sockets=[sock]))))
        while not all(server.started for server, _ in servers):
            for _, task in servers:
                if task.done():
                    await task  # a server that could not start: its error, not a hang
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=CALL_SECONDS * MAX_TOOL_CALLS) as client:
            reply = await client.post(f"{urls['planner']}/ask", json={"question": "Plan the team offsite"})
        print(f"planner's final answer: {reply.json()['answer']!r} after {tool_calls} tool calls")
    finally:
        # Stop every server this program started, and wait until each has closed its socket.
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*(task for _, task in servers), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(guarded="--without-guard" not in sys.argv))
