"""One agent of ``otel-guard demo --stack``: an HTTP service behind the guard's ASGI middleware.

Run by the demo as ``python -m otel_guard._demo.agent AGENT SKILL OTLP_ENDPOINT``; it serves
``POST /ask`` on 127.0.0.1 (an ephemeral port, printed as ``ready PORT``), exports its spans over
OTLP/gRPC to ``OTLP_ENDPOINT``, and exits on SIGTERM once its spans are sent. Asked, the planner asks
the budget agent to price its plan and the budget agent asks the planner for the itinerary: the loop.
The peers' addresses come in the request, so neither needs to know the other's port at start.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import urllib.error
import urllib.request
from typing import Any

MAX_ASKS = 4  # bounds the loop even where nothing refuses it (the guard does, at the first bounce)


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={**headers, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        text = refused.read()
        try:
            return refused.code, json.loads(text)
        except ValueError:
            return refused.code, {"message": text.decode(errors="replace")}


def main(agent: str, skill: str, endpoint: str) -> None:
    import uvicorn
    from opentelemetry import propagate, trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from otel_guard import current_chain
    from otel_guard.asgi import GuardMiddleware

    provider = TracerProvider(resource=Resource.create({"service.name": agent}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    trace.set_tracer_provider(provider)
    other = "budget" if agent == "planner" else "planner"

    async def ask(request: Request) -> JSONResponse:
        body = await request.json()
        chain = current_chain()
        if chain is not None and chain.depth > 1:
            hops = " → ".join(hop.agent for hop in chain.hops)
            print(f"{agent}: a signed chain arrived and verified: {hops}", flush=True)
        if body["asks"] >= MAX_ASKS:
            return JSONResponse({"answer": f"{agent} gives up"})
        print(f"{agent} asks {other}", flush=True)
        headers: dict[str, str] = {}
        propagate.inject(headers)  # this hop's context: the chain rides in its W3C baggage
        peer = f"{body['peers'][other]}/ask"
        status, reply = await asyncio.to_thread(_post, peer, {**body, "asks": body["asks"] + 1}, headers)
        if status != 200:
            print(f"{agent}: {other} refused ({status}): {reply.get('message')}", flush=True)
            return JSONResponse({"answer": f"{agent} answers with what it has"})
        return JSONResponse({"answer": f"{agent}'s answer, from {other}'s: {reply['answer']}"})

    app = GuardMiddleware(Starlette(routes=[Route("/ask", ask, methods=["POST"])]), agent=agent, skill=skill)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # listening before "ready": the first request may come before uvicorn has started
    print(f"ready {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    # uvicorn shuts down on SIGTERM, then raises the signal again for the handler it found: make
    # that one a no-op, or the default would end the process before its spans are sent.
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        server.run(sockets=[sock])  # until SIGTERM
    finally:
        provider.shutdown()  # every span sent before the process goes


if __name__ == "__main__":
    main(*sys.argv[1:4])
