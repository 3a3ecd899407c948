"""Planner and Budget, two A2A agents that ask each other: planner -> budget -> planner -> ...

Planner builds trip plans and asks Budget to price them (skill ``price``); Budget asks Planner for
the itinerary (skill ``itinerary``). Left alone they bounce until the ``hops`` counter they pass in
the request metadata reaches ``max_hops`` (the bound that keeps an unguarded run finite). They are
plain code, no model: when an onward call fails (an ``A2AClientError``, which a refusal is) the agent
answers with what it has and quotes the error, so a refusal deep in the loop shows in the outermost
answer.

Used in-process by the tests (:func:`build_app`, :func:`http_server`) and as a program, the way a
user runs an agent::

    opentelemetry-instrument python travel_agent.py --name planner --port-file P --peer-port-file B

which serves A2A (JSON-RPC at ``/``, HTTP+JSON at ``/rest``, the card at the well-known path) on
127.0.0.1 at a free port, writes the port to ``--port-file`` once it listens, and reaches its peer at
the port in ``--peer-port-file`` (read when needed, so the two can start in any order). Every
execution prints ``travel_agent: ran {json}`` to stderr: the agent, skill, hop count and the chain
otel-guard shows it (``null`` without otel-guard).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from a2a.client import A2AClientError, ClientConfig, create_client
from a2a.helpers import get_stream_response_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, LegacyRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
)
from a2a.utils.constants import TransportProtocol
from starlette.applications import Starlette

SKILLS = {"planner": ("plan", "itinerary"), "budget": ("price",)}
ONWARD = {"planner": "price", "budget": "itinerary"}
OWN_ANSWER = {"planner": "plan: 3 days in Lisbon", "budget": "price: 1200 EUR"}
MAX_HOPS = 6
"""Enough for an unguarded loop to bounce several times, few enough to stay quick."""
CALL_SECONDS = 30.0
RAN_PREFIX = "travel_agent: ran "

JSONRPC = TransportProtocol.JSONRPC.value
REST = TransportProtocol.HTTP_JSON.value
GRPC = TransportProtocol.GRPC.value


def current_chain_agents() -> list[str] | None:
    """The agents of the chain this code runs under, as otel-guard sees it (None without it)."""
    try:
        import otel_guard
    except ImportError:  # pragma: no cover - the program also runs without otel-guard
        return None
    chain = otel_guard.current_chain()
    return None if chain is None else [hop.agent for hop in chain.hops]


def request(text: str, skill: str | None = None, **metadata: Any) -> SendMessageRequest:
    """A user message, asking for ``skill`` when given."""
    if skill is not None:
        metadata["skill"] = skill
    return SendMessageRequest(
        message=Message(role=Role.ROLE_USER, parts=[Part(text=text)], message_id=str(uuid.uuid4())),
        metadata=metadata,
    )


def client_config(binding: str = JSONRPC, streaming: bool = False) -> ClientConfig:
    config = ClientConfig(streaming=streaming, supported_protocol_bindings=[binding])
    if binding == GRPC:
        import grpc

        config.grpc_channel_factory = grpc.aio.insecure_channel
    return config


async def ask(
    agent: str | AgentCard,
    text: str,
    skill: str | None = None,
    *,
    binding: str = JSONRPC,
    streaming: bool = False,
    **metadata: Any,
) -> str:
    """Send one message to the agent (at a URL, or by its card) and return its answer's text."""
    client = await create_client(agent, client_config=client_config(binding, streaming))
    try:
        events = client.send_message(request(text, skill, **metadata))
        texts = [get_stream_response_text(event) async for event in events]
    finally:
        await client.close()
    return " ".join(t for t in texts if t)


class TravelAgent(AgentExecutor):
    """Planner or Budget (see the module docs); ``record`` gets one dict per execution."""

    def __init__(
        self,
        name: str,
        peer: Callable[[], str | AgentCard] | None,
        record: Callable[[dict[str, Any]], None],
        *,
        binding: str = JSONRPC,
        streaming: bool = False,
        max_hops: int = MAX_HOPS,
    ) -> None:
        self.name = name
        self.peer = peer
        self.record = record
        self.binding = binding
        self.streaming = streaming
        self.max_hops = max_hops

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        metadata: dict[str, Any] = dict(context.metadata or {})
        skill = str(metadata.get("skill") or SKILLS[self.name][0])
        hops = int(metadata.get("hops") or 1)
        chain = current_chain_agents()
        self.record({"agent": self.name, "skill": skill, "hops": hops, "chain": chain})
        answer = OWN_ANSWER[self.name]
        if self.peer is not None and hops < self.max_hops:
            try:
                reply = await ask(
                    self.peer(),
                    f"{self.name} asks: {answer}",
                    ONWARD[self.name],
                    binding=self.binding,
                    streaming=self.streaming,
                    hops=hops + 1,
                )
                answer = f"{answer} <{reply}>"
            except A2AClientError as err:
                # Answer with what we have: the agent we asked cannot help.
                answer = f"{answer} [{type(err).__name__}: {err}]"
        await event_queue.enqueue_event(
            new_text_message(answer, context_id=context.context_id, task_id=context.task_id)
        )

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("the travel agents answer at once")


def agent_card(
    name: str, base_url: str | None, *, grpc_url: str | None = None, streaming: bool = False
) -> AgentCard:
    """The agent's card: JSON-RPC and HTTP+JSON under ``base_url``, gRPC at ``grpc_url``."""
    interfaces = []
    if base_url is not None:
        interfaces += [
            AgentInterface(url=f"{base_url}/", protocol_binding=JSONRPC, protocol_version="1.0"),
            AgentInterface(url=f"{base_url}/rest", protocol_binding=REST, protocol_version="1.0"),
        ]
    if grpc_url is not None:
        interfaces.append(AgentInterface(url=grpc_url, protocol_binding=GRPC, protocol_version="1.0"))
    return AgentCard(
        name=name,
        description=f"The {name} travel agent",
        version="1.0.0",
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id=skill, name=skill, description=f"{name}: {skill}", tags=[skill])
            for skill in SKILLS[name]
        ],
    )


async def start_grpc_server(executor: TravelAgent, *, streaming: bool = False) -> tuple[Any, AgentCard]:
    """Serve the agent over gRPC on a free port of 127.0.0.1 in the running loop; return the
    started ``grpc.aio`` server and the agent's card."""
    import grpc
    from a2a.server.request_handlers import GrpcHandler
    from a2a.types import a2a_pb2_grpc

    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    card = agent_card(executor.name, None, grpc_url=f"127.0.0.1:{port}", streaming=streaming)
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    await server.start()
    return server, card


def build_app(
    executor: TravelAgent, base_url: str, *, streaming: bool = False, legacy: bool = False
) -> Starlette:
    """The agent's A2A app: card, JSON-RPC at ``/`` and HTTP+JSON at ``/rest``."""
    card = agent_card(executor.name, base_url, streaming=streaming)
    handler_class = LegacyRequestHandler if legacy else DefaultRequestHandler
    handler = handler_class(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    return Starlette(
        routes=[
            *create_agent_card_routes(card),
            *create_jsonrpc_routes(handler, rpc_url="/"),
            *create_rest_routes(handler, path_prefix="/rest"),
        ]
    )


def listening_socket() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1 (clients wait in its backlog until serving)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def http_server(app: Starlette) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))


def _port_url(port_file: Path) -> str:
    return f"http://127.0.0.1:{port_file.read_text().strip()}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Planner or Budget, served over A2A.")
    parser.add_argument("--name", choices=sorted(SKILLS), required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--peer-port-file", type=Path, help="where the peer wrote its port")
    parser.add_argument("--binding", choices=[JSONRPC, REST], default=JSONRPC)
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--max-hops", type=int, default=MAX_HOPS)
    args = parser.parse_args(argv)

    def record(execution: dict[str, Any]) -> None:
        print(RAN_PREFIX + json.dumps(execution), file=sys.stderr, flush=True)

    peer_file: Path | None = args.peer_port_file
    executor = TravelAgent(
        args.name,
        (lambda: _port_url(peer_file)) if peer_file is not None else None,
        record,
        binding=args.binding,
        streaming=args.streaming,
        max_hops=args.max_hops,
    )
    sock = listening_socket()
    port = sock.getsockname()[1]
    app = build_app(executor, f"http://127.0.0.1:{port}", streaming=args.streaming)
    partial = f"{args.port_file}.tmp"
    with open(partial, "w") as out:  # written atomically: a reader never sees half a port number
        out.write(str(port))
    os.replace(partial, args.port_file)
    http_server(app).run(sockets=[sock])


if __name__ == "__main__":
    main()
