"""A stand-in LangGraph server: just enough of the Agent Server API for ``RemoteGraph`` to call.

``POST /runs/stream`` (and ``/threads/{thread_id}/runs/stream``) runs the assistant the body names,
``planner`` or ``budget`` from ``langgraph_app`` (each with the other as a tool: a ``RemoteGraph``
back to this server), and answers with the final state as one server-sent ``values`` event, or an
``error`` event as the real server sends one. The request's OpenTelemetry context (``traceparent``,
``baggage``) is extracted and attached around the run, as an ASGI server instrumentation would do.
``GET /script`` tells what the scripted models saw and which carrier headers arrived.

Run it the way a user runs a server, configured from the environment only::

    opentelemetry-instrument python langgraph_server_app.py

It listens on a free port of 127.0.0.1, prints ``PORT <n>`` and stops on SIGTERM (flushing its
telemetry on the way out).
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from typing import Any, NoReturn

import anyio
import uvicorn
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.pregel.remote import RemoteGraph
from langgraph_app import Script, ScriptedToolModel, agent_graph, last_text
from langgraph_sdk import get_sync_client
from opentelemetry import context, propagate
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

CARRIER_HEADERS = ("traceparent", "baggage")


def remote_agent(name: str, url: str) -> RemoteGraph:
    """The agent ``name`` served at ``url``, with a client that gives up in seconds, not minutes."""
    return RemoteGraph(name, sync_client=get_sync_client(url=url, api_key=None, timeout=30))


def remote_agent_tool(name: str, remote: Runnable[Any, Any]) -> BaseTool:
    """A tool that asks the remote agent ``name``."""

    def ask(question: str) -> str:
        return last_text(remote.invoke({"messages": [{"role": "user", "content": question}]}))

    return StructuredTool.from_function(
        func=ask, name=name, description=f"Ask the remote {name} agent a question."
    )


class Server:
    def __init__(self, url: str) -> None:
        self.script = Script(max_tool_calls=6)
        self.carriers: list[dict[str, str]] = []
        self.graphs = {
            agent: agent_graph(
                agent,
                ScriptedToolModel(agent=agent, script=self.script),
                [remote_agent_tool(other, remote_agent(other, url))],
            )
            for agent, other in (("planner", "budget"), ("budget", "planner"))
        }

    def run(self, carrier: dict[str, str], assistant_id: str, graph_input: Any) -> str:
        """One run, in the context the request carried; the answer as server-sent events."""
        token = context.attach(propagate.extract(carrier))
        try:
            state = self.graphs[assistant_id].invoke(graph_input)
        except Exception as exc:
            error = {"error": type(exc).__name__, "message": str(exc)}
            return f"event: error\ndata: {json.dumps(error)}\n\n"
        finally:
            context.detach(token)
        values = {"messages": [message.model_dump() for message in state["messages"]]}
        return f"event: values\ndata: {json.dumps(values, default=str)}\n\n"

    async def runs_stream(self, request: Request) -> Response:
        body = await request.json()
        carrier = {k: v for k, v in request.headers.items() if k in CARRIER_HEADERS}
        self.carriers.append(carrier)
        events = await anyio.to_thread.run_sync(self.run, carrier, body["assistant_id"], body["input"])
        return Response(events, media_type="text/event-stream")

    async def script_state(self, request: Request) -> Response:
        return JSONResponse(
            {
                "runs": self.script.runs,
                "tool_replies": [
                    {"agent": agent, "tool": m.name, "status": m.status, "content": m.content}
                    for agent, m in self.script.tool_replies
                ],
                "carriers": self.carriers,
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/runs/stream", self.runs_stream, methods=["POST"]),
                Route("/threads/{thread_id}/runs/stream", self.runs_stream, methods=["POST"]),
                Route("/script", self.script_state, methods=["GET"]),
            ]
        )


def _exit(signum: int, frame: object) -> NoReturn:
    # uvicorn shuts down gracefully, restores this handler and raises the signal again: exiting
    # through SystemExit runs the SDK's exit hooks, which flush the spans.
    sys.exit(0)


def main() -> None:
    signal.signal(signal.SIGTERM, _exit)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = Server(f"http://127.0.0.1:{port}")
    config = uvicorn.Config(server.app(), log_level="warning", lifespan="off")
    print(f"PORT {port}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
