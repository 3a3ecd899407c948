"""One agent of a pair in a process of its own, reached over HTTP; nothing of otel-guard's in it.

``planner`` and ``budget`` each serve ``POST /ask`` (Starlette on uvicorn, 127.0.0.1) and run a
pydantic-ai agent (its offline ``FunctionModel``) whose one tool asks the other agent over HTTP with
httpx. The processes share no chain and no otel-guard: the only link between their spans is the
trace context that OpenTelemetry's httpx (client) and ASGI (server) instrumentations carry, and
pydantic-ai's own instrumentation (``Agent.instrument_all()``) records the agent runs and tool calls.
Spans go over OTLP/gRPC to ``OTEL_EXPORTER_OTLP_ENDPOINT``::

    python http_agent_app.py NAME PEER_PORT_FILE MAX_TOOL_CALLS --port-file FILE

The program picks a free port, writes it to ``FILE`` once it serves, and stops on SIGTERM; it reads
the other agent's port from ``PEER_PORT_FILE`` when it first asks it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

import httpx
import uvicorn
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic_ai import Agent, Tool
from pydantic_ai.models.function import FunctionModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "instrumentation" / "pydantic_ai"))
from pydantic_ai_app import ScriptedModel


def build_app(name: str, peer_port_file: Path, max_tool_calls: int) -> Starlette:
    peer = "budget" if name == "planner" else "planner"
    model = ScriptedModel(name, f"ask_{peer}", max_tool_calls)

    async def ask_peer(question: str) -> str:
        """Ask the other agent over HTTP."""
        async with httpx.AsyncClient(timeout=30) as client:
            peer_url = f"http://127.0.0.1:{peer_port_file.read_text().strip()}/ask"
            response = await client.post(peer_url, json={"question": question})
            response.raise_for_status()
            return str(response.json()["answer"])

    agent: Agent[None, str] = Agent(
        FunctionModel(model.respond), name=name, tools=[Tool(ask_peer, name=f"ask_{peer}")]
    )

    async def ask(request: Request) -> JSONResponse:
        question = (await request.json())["question"]
        return JSONResponse({"answer": (await agent.run(question)).output})

    return Starlette(routes=[Route("/ask", ask, methods=["POST"])])


async def serve(name: str, peer_port_file: Path, max_tool_calls: int, port_file: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    app = OpenTelemetryMiddleware(build_app(name, peer_port_file, max_tool_calls))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    port_file.write_text(str(listener.getsockname()[1]))
    await task


def main(argv: list[str]) -> None:
    name, peer_port_file, max_tool_calls, flag, port_file = argv
    assert flag == "--port-file", argv
    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=100))
    trace.set_tracer_provider(provider)
    Agent.instrument_all()
    HTTPXClientInstrumentor().instrument()
    try:
        asyncio.run(serve(name, Path(peer_port_file), int(max_tool_calls), Path(port_file)))
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
