"""A2A over gRPC: Planner and Budget as real ``grpc.aio`` servers on 127.0.0.1, real gRPC clients.

The chain travels in the gRPC metadata (the SDK sends a call's service parameters as metadata); a
refusal comes back as the status ``ABORTED`` with the refusal's ``ErrorInfo`` in the status details.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from a2a.client import A2AClientError, ClientFactory, minimal_agent_card
from a2a.helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.types import AgentCard, a2a_pb2_grpc
from a2a_apps.travel_agent import (  # this folder is on sys.path
    GRPC,
    TravelAgent,
    ask,
    client_config,
    request,
    start_grpc_server,
)
from instrumentors import instrumentor_fixture
from opentelemetry import baggage, propagate
from opentelemetry.trace import SpanKind

import otel_guard
from otel_guard.instrumentation.a2a import A2AInstrumentor
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY
from tests.conventions import assert_follows

pytestmark = pytest.mark.integration

REFUSED_TEXT = "Delegation cycle: agent planner is already in chain planner → budget"


instrumented = instrumentor_fixture(A2AInstrumentor)


class GrpcAgents:
    def __init__(self) -> None:
        self.cards: dict[str, AgentCard] = {}
        self.ran: list[dict[str, Any]] = []


@pytest.fixture
async def grpc_agents(instrumented: A2AInstrumentor) -> AsyncIterator[GrpcAgents]:
    agents = GrpcAgents()
    servers = []
    for name, peer in (("planner", "budget"), ("budget", "planner")):
        executor = TravelAgent(
            name,
            lambda peer=peer: agents.cards[peer],  # type: ignore[misc]
            agents.ran.append,
            binding=GRPC,
        )
        server, agents.cards[name] = await start_grpc_server(executor)
        servers.append(server)
    yield agents
    for server in servers:
        await server.stop(None)


async def test_loop_over_grpc_is_refused_at_the_first_bounce(spans: Any, grpc_agents: GrpcAgents) -> None:
    otel_guard.configure(cycle_rule="agent")

    answer = await ask(grpc_agents.cards["planner"], "a 3-day Lisbon trip", "plan", binding=GRPC)

    assert [(r["agent"], r["chain"]) for r in grpc_agents.ran] == [
        ("planner", ["planner"]),
        ("budget", ["planner", "budget"]),
    ]
    assert answer.startswith("plan: 3 days in Lisbon <price: 1200 EUR [A2ADelegationRefused: ")
    assert REFUSED_TEXT in answer
    hops = [s for s in spans.all() if s.name.startswith("invoke_agent ")]
    assert sorted((s.name, s.kind.name, dict(s.attributes or {})["otel_guard.decision"]) for s in hops) == [
        ("invoke_agent budget", "CLIENT", "allow"),
        ("invoke_agent budget", "INTERNAL", "allow"),
        ("invoke_agent planner", "CLIENT", "allow"),
        ("invoke_agent planner", "CLIENT", "refuse"),
        ("invoke_agent planner", "INTERNAL", "allow"),
    ]
    assert len({s.context.trace_id for s in hops}) == 1
    for span in hops:  # over gRPC too, each hop follows the conventions (tests/conventions.py)
        assert_follows(span, "a2a.client" if span.kind is SpanKind.CLIENT else "a2a.server")
        assert dict(span.attributes or {})["a2a.method.name"] == "SendMessage"


async def test_server_refusal_over_grpc_is_aborted_and_raised_as_a2a_delegation_refused(
    spans: Any, grpc_agents: GrpcAgents
) -> None:
    """A bootstrap card has no name, so this client adds no hop: Planner's server refuses."""
    otel_guard.configure(cycle_rule="agent")
    url = grpc_agents.cards["planner"].supported_interfaces[0].url
    client = ClientFactory(client_config(GRPC)).create(minimal_agent_card(url, [GRPC]))

    with (
        otel_guard.delegate("planner"),
        otel_guard.delegate("budget"),
        pytest.raises(A2AClientError) as caught,
    ):
        async for _ in client.send_message(request("the itinerary, please", "itinerary")):
            pass
    await client.close()

    err = caught.value
    assert isinstance(err, otel_guard.DelegationRefused)
    assert (err.code, err.reason, err.status, str(err)) == (
        "a2a_delegation_cycle",
        "cycle",
        409,
        REFUSED_TEXT,
    )
    cause = err.__cause__
    assert isinstance(cause, grpc.aio.AioRpcError)
    assert cause.code() is grpc.StatusCode.ABORTED
    assert grpc_agents.ran == []
    (refused,) = [
        s
        for s in spans.named("invoke_agent planner")
        if s.kind is SpanKind.INTERNAL and "a2a.method.name" in (s.attributes or {})
    ]
    assert dict(refused.attributes or {})["otel_guard.decision"] == "refuse"


class ContextInReply(AgentExecutor):
    """An agent that hands its context back in the reply metadata, as an app that injects its
    context into every reply would: W3C baggage with the chain of the hop it runs in."""

    name = "budget"

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.call_context is not None
        grpc_context = context.call_context.state["grpc_context"]
        carrier: dict[str, str] = {}
        propagate.inject(carrier, baggage.set_baggage("tenant", "acme"))
        assert CHAIN_BAGGAGE_KEY in carrier["baggage"]  # the hop's chain is in what it would send
        await grpc_context.send_initial_metadata((("baggage", carrier["baggage"]), ("x-app", "kept")))
        grpc_context.set_trailing_metadata((("baggage", carrier["baggage"]),))
        await event_queue.enqueue_event(new_text_message("ok"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


async def test_no_grpc_reply_metadata_carries_the_chain(instrumented: A2AInstrumentor) -> None:
    """The chain is taken out of the baggage of the reply's initial and trailing metadata; the other
    baggage members and metadata stay."""
    server, card = await start_grpc_server(ContextInReply())  # type: ignore[arg-type]
    try:
        async with grpc.aio.insecure_channel(card.supported_interfaces[0].url) as channel:
            call = a2a_pb2_grpc.A2AServiceStub(channel).SendMessage(
                request("hello"), metadata=(("a2a-version", "1.0"),)
            )
            await call
            initial = list(await call.initial_metadata())
            trailing = list(await call.trailing_metadata())
    finally:
        await server.stop(None)
    assert ("x-app", "kept") in initial
    reply_baggage = [value for key, value in [*initial, *trailing] if key == "baggage"]
    assert reply_baggage == ["tenant=acme", "tenant=acme"]


async def test_a_chain_in_the_first_of_two_baggage_entries_is_read(
    spans: Any, grpc_agents: GrpcAgents
) -> None:
    """gRPC metadata may repeat ``baggage`` (a proxy that adds its own member, a client that sends
    two); the entries are one baggage, joined as repeated HTTP headers are, so the chain in the
    first still stops the loop."""
    otel_guard.configure(cycle_rule="agent")
    carrier: dict[str, str] = {}
    with otel_guard.delegate("planner"), otel_guard.delegate("budget"):
        propagate.inject(carrier)
    assert CHAIN_BAGGAGE_KEY in carrier["baggage"]
    metadata = (("a2a-version", "1.0"), ("baggage", carrier["baggage"]), ("baggage", "tenant=acme"))
    url = grpc_agents.cards["planner"].supported_interfaces[0].url
    async with grpc.aio.insecure_channel(url) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a2a_pb2_grpc.A2AServiceStub(channel).SendMessage(request("hello"), metadata=metadata)
    assert caught.value.code() is grpc.StatusCode.ABORTED
    assert REFUSED_TEXT in (caught.value.details() or "")
    assert grpc_agents.ran == []  # planner never ran
