"""A2A in one process: Planner and Budget as real A2A servers (uvicorn on 127.0.0.1), real clients.

Each agent is served by uvicorn in a thread of this process, so their spans land in the session's
in-memory exporter next to the test client's. Every call crosses real HTTP (JSON-RPC or HTTP+JSON,
streaming or not); the chain travels only in the request headers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from a2a.client import A2AClientError, ClientConfig, ClientFactory, minimal_agent_card
from a2a_apps.travel_agent import (  # this folder is on sys.path
    CALL_SECONDS,
    JSONRPC,
    MAX_HOPS,
    REST,
    TravelAgent,
    ask,
    build_app,
    http_server,
    listening_socket,
    request,
)
from google.protobuf.json_format import MessageToDict
from instrumentors import instrumentor_fixture
from opentelemetry import propagate
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import otel_guard
from otel_guard.chain import generate_key
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.a2a import PATCH_TARGETS, A2ADelegationRefused, A2AInstrumentor
from tests.conventions import assert_follows
from tests.core.redis_server import paused_under_probe, running_redis

pytestmark = pytest.mark.integration

REFUSED_TEXT = "Delegation cycle: agent planner is already in chain planner → budget"


instrumented = instrumentor_fixture(A2AInstrumentor)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def hop_spans(spans: Any) -> list[ReadableSpan]:
    """Our hop spans (the SDK's own spans are named after its methods)."""
    return [s for s in spans.all() if s.name.startswith("invoke_agent ")]


async def settled(spans: Any, count: int) -> list[ReadableSpan]:
    """Our hop spans once ``count`` have ended (a server ends a streamed hop just after the client
    has read the last event), or what there is after a few seconds."""
    deadline = time.monotonic() + 5
    while len(hop_spans(spans)) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return hop_spans(spans)


def decisions(spans: Any) -> list[tuple[str, str, str, int]]:
    return sorted(
        (
            s.name,
            s.kind.name,
            attributes(s)["otel_guard.decision"],
            attributes(s)["otel_guard.chain.depth"],
        )
        for s in hop_spans(spans)
    )


# -- two agents on uvicorn in this process ------------------------------------------------------


@dataclass
class Agents:
    """Planner and Budget served here; ``ran`` lists their executions in order."""

    planner: str
    budget: str
    binding: str
    streaming: bool
    ran: list[dict[str, Any]] = field(default_factory=list)

    def executions(self) -> list[tuple[str, str]]:
        return [(r["agent"], r["skill"]) for r in self.ran]

    async def ask_planner(self, **metadata: Any) -> str:
        return await ask(
            self.planner,
            "a 3-day Lisbon trip under 1500 EUR",
            "plan",
            binding=self.binding,
            streaming=self.streaming,
            **metadata,
        )


@dataclass
class Served:
    stop: Callable[[], None]


def serve(executor: TravelAgent, *, streaming: bool, legacy: bool) -> tuple[str, Served]:
    """Serve one agent on uvicorn in a thread; return its URL and how to stop it."""
    sock = listening_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = http_server(build_app(executor, url, streaming=streaming, legacy=legacy))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"

    return url, Served(stop)


@pytest.fixture
def start_agents() -> Iterator[Callable[..., Agents]]:
    """Start Planner and Budget (after the test instrumented or not); both stop at teardown."""
    started: list[Served] = []

    def start(binding: str = JSONRPC, streaming: bool = False, legacy: bool = False) -> Agents:
        urls: dict[str, str] = {}
        ran: list[dict[str, Any]] = []
        for name, peer in (("planner", "budget"), ("budget", "planner")):
            executor = TravelAgent(
                name,
                lambda peer=peer: urls[peer],  # type: ignore[misc]
                ran.append,
                binding=binding,
                streaming=streaming,
            )
            urls[name], served = serve(executor, streaming=streaming, legacy=legacy)
            started.append(served)
        return Agents(urls["planner"], urls["budget"], binding, streaming, ran)

    yield start
    for served in started:
        served.stop()


TRANSPORTS = [
    pytest.param(JSONRPC, False, False, id="jsonrpc"),
    pytest.param(JSONRPC, True, False, id="jsonrpc-streaming"),
    pytest.param(REST, False, False, id="rest"),
    pytest.param(REST, True, False, id="rest-streaming"),
    pytest.param(JSONRPC, False, True, id="jsonrpc-legacy-handler"),
    pytest.param(JSONRPC, True, True, id="jsonrpc-streaming-legacy-handler"),
]


# -- the loop -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("binding", "streaming", "legacy"), TRANSPORTS)
async def test_loop_is_refused_at_the_first_bounce(
    instrumented: A2AInstrumentor,
    spans: Any,
    start_agents: Callable[..., Agents],
    binding: str,
    streaming: bool,
    legacy: bool,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents(binding, streaming, legacy)

    answer = await agents.ask_planner()

    # Budget's call back into Planner was refused before it was sent; Planner ran once.
    assert agents.executions() == [("planner", "plan"), ("budget", "price")]
    assert [r["chain"] for r in agents.ran] == [["planner"], ["planner", "budget"]]
    # Budget answered with what it had, and so did Planner: the run completes with an answer.
    assert answer.startswith("plan: 3 days in Lisbon <price: 1200 EUR [A2ADelegationRefused: ")
    assert REFUSED_TEXT in answer
    await settled(spans, 5)
    assert decisions(spans) == [
        ("invoke_agent budget", "CLIENT", "allow", 2),
        ("invoke_agent budget", "INTERNAL", "allow", 2),
        ("invoke_agent planner", "CLIENT", "allow", 1),
        ("invoke_agent planner", "CLIENT", "refuse", 3),
        ("invoke_agent planner", "INTERNAL", "allow", 1),
    ]
    ours = hop_spans(spans)
    assert len({s.context.trace_id for s in ours}) == 1  # one trace across both servers
    assert len({attributes(s)["otel_guard.chain.root"] for s in ours}) == 1  # and one chain


@pytest.mark.parametrize(("binding", "streaming", "legacy"), TRANSPORTS)
async def test_hop_spans_follow_the_conventions(
    instrumented: A2AInstrumentor,
    spans: Any,
    start_agents: Callable[..., Agents],
    binding: str,
    streaming: bool,
    legacy: bool,
) -> None:
    """Every hop of the loop, client (CLIENT, a remote agent) and server (INTERNAL, the agent runs
    there) side, allowed or refused, is a GenAI invoke_agent span with the A2A attributes of its
    request (tests/conventions.py): the card gives the description and version, the message its id
    and the reply the context and the task."""
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents(binding, streaming, legacy)
    await agents.ask_planner()
    ours = await settled(spans, 5)

    assert len(ours) == 5
    for span in ours:
        client = span.kind is SpanKind.CLIENT
        available = {
            "gen_ai.agent.name",
            "gen_ai.agent.description",
            "gen_ai.agent.version",
            "a2a.message.id",
        }
        if attributes(span)["otel_guard.decision"] == "refuse":
            available.add("error.type")  # refused before anything was sent: no reply to read
        else:
            available |= {"gen_ai.conversation.id", "a2a.task.id"}
        if client:
            available.add("server.port")
        assert_follows(span, "a2a.client" if client else "a2a.server", available)
        method = "SendStreamingMessage" if streaming else "SendMessage"
        assert attributes(span)["a2a.method.name"] == method
        assert (
            attributes(span)["gen_ai.agent.description"]
            == f"The {attributes(span)['gen_ai.agent.name']} travel agent"
        )
        if client and binding == JSONRPC:
            assert attributes(span)["server.address"] == "127.0.0.1"


@pytest.fixture
def tracecontext_only() -> Iterator[None]:
    """``OTEL_PROPAGATORS=tracecontext``: the global propagator carries no baggage."""
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())
    yield
    propagate.set_global_textmap(previous)


async def test_the_chain_travels_even_when_the_propagators_leave_baggage_out(
    instrumented: A2AInstrumentor,
    spans: Any,
    start_agents: Callable[..., Agents],
    tracecontext_only: None,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents()

    answer = await agents.ask_planner()

    assert agents.executions() == [("planner", "plan"), ("budget", "price")]
    assert REFUSED_TEXT in answer
    assert len({s.context.trace_id for s in hop_spans(spans)}) == 1


async def test_spans_carry_the_contract_attributes(
    instrumented: A2AInstrumentor, spans: Any, start_agents: Callable[..., Agents]
) -> None:
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents()
    await agents.ask_planner()

    budget_server = next(s for s in spans.named("invoke_agent budget") if s.kind is SpanKind.INTERNAL)
    root = attributes(budget_server)["otel_guard.chain.root"]
    assert len(root) == 32
    assert set(root) <= set("0123456789abcdef")
    ids = {
        key: attributes(budget_server)[key]
        for key in ("a2a.message.id", "a2a.task.id", "gen_ai.conversation.id")
    }
    assert all(isinstance(value, str) and value for value in ids.values()), ids
    assert attributes(budget_server) == {
        **ids,
        "a2a.method.name": "SendMessage",
        "a2a.protocol.version": "1.0",
        "gen_ai.agent.description": "The budget travel agent",
        "gen_ai.agent.version": "1.0.0",
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "budget",
        "otel_guard.skill": "price",
        "otel_guard.chain.agents": ("planner", "budget"),
        "otel_guard.chain.skills": ("plan", "price"),
        "otel_guard.chain.root": root,
        "otel_guard.chain.depth": 2,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 2,  # the tree's count, which the caller's hop made 2 (not added to)
    }
    refused = next(
        s for s in spans.named("invoke_agent planner") if attributes(s)["otel_guard.decision"] == "refuse"
    )
    assert refused.kind is SpanKind.CLIENT
    assert attributes(refused)["otel_guard.reason"] == "cycle"
    assert attributes(refused)["otel_guard.chain.agents"] == ("planner", "budget", "planner")
    assert attributes(refused)["otel_guard.skill"] == "itinerary"
    assert attributes(refused)["otel_guard.name_depth"] == 2
    (event,) = refused.events
    assert event.name == "otel_guard.refused"
    assert dict(event.attributes or {})["otel_guard.reason"] == "cycle"
    assert REFUSED_TEXT in str(dict(event.attributes or {})["otel_guard.message"])
    assert all("otel_guard.chain=" not in str(attributes(s)) for s in spans.all())


async def test_sdk_spans_and_ours_nest(
    instrumented: A2AInstrumentor, spans: Any, start_agents: Callable[..., Agents]
) -> None:
    """The SDK's own spans and our hop spans form one tree across both servers."""
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents()
    await agents.ask_planner()

    by_id = {s.context.span_id: s for s in spans.all()}

    def ancestry(span: ReadableSpan) -> list[tuple[str, SpanKind]]:
        found = []
        while span.parent is not None:
            span = by_id[span.parent.span_id]
            found.append((span.name.rsplit(".", 1)[-1], span.kind))
        return found

    budget_server = next(s for s in spans.named("invoke_agent budget") if s.kind is SpanKind.INTERNAL)
    budget_client = next(s for s in spans.named("invoke_agent budget") if s.kind is SpanKind.CLIENT)
    above = ancestry(budget_server)
    # Up from Budget's server hop: the SDK's server spans, then the client hop that sent the
    # request (its context is what travelled in the headers)...
    client_at = above.index(("invoke_agent budget", SpanKind.CLIENT))
    assert ("handle_requests", SpanKind.SERVER) in above[:client_at]
    assert all(not name.startswith("invoke_agent") for name, _ in above[:client_at])
    # ... which runs inside Planner's executor, inside Planner's server hop, up to the test's own
    # send: the root of the one trace.
    assert ("invoke_agent planner", SpanKind.INTERNAL) in above[client_at:]
    assert above[-1] == ("invoke_agent planner", SpanKind.CLIENT)
    # The SDK's transport span for that request is a child of the client hop, not a second hop.
    (transport,) = [
        s
        for s in spans.all()
        if s.name.endswith("JsonRpcTransport.send_message")
        and s.parent is not None
        and s.parent.span_id == budget_client.context.span_id
    ]
    assert transport.kind is SpanKind.CLIENT


async def test_default_rule_lets_planner_be_asked_for_a_new_job_once(
    instrumented: A2AInstrumentor, spans: Any, start_agents: Callable[..., Agents]
) -> None:
    """Same agent and skill (the default): hop 3 (itinerary) is a new job, hop 4 repeats one."""
    agents = start_agents()

    answer = await agents.ask_planner()

    assert agents.executions() == [("planner", "plan"), ("budget", "price"), ("planner", "itinerary")]
    assert "agent budget with skill price is already in chain planner → budget → planner" in answer
    refused = [s for s in hop_spans(spans) if attributes(s)["otel_guard.decision"] == "refuse"]
    assert [(s.name, s.kind.name, attributes(s)["otel_guard.chain.skills"]) for s in refused] == [
        ("invoke_agent budget", "CLIENT", ("plan", "price", "itinerary", "price"))
    ]


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: A2AInstrumentor, spans: Any, start_agents: Callable[..., Agents]
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    agents = start_agents()

    answer = await agents.ask_planner()

    # Unrefused, the loop runs until the agents' own bound stops it.
    assert [r["hops"] for r in agents.ran] == list(range(1, MAX_HOPS + 1))
    assert "Refused" not in answer
    outcomes = {attributes(s)["otel_guard.decision"] for s in hop_spans(spans)}
    assert outcomes == {"allow", "would_refuse"}
    first = min(
        (s for s in hop_spans(spans) if attributes(s)["otel_guard.decision"] == "would_refuse"),
        key=lambda s: (attributes(s)["otel_guard.chain.depth"], s.kind is SpanKind.INTERNAL),
    )
    assert (first.name, first.kind, attributes(first)["otel_guard.chain.depth"]) == (
        "invoke_agent planner",
        SpanKind.CLIENT,
        3,
    )
    assert attributes(first)["otel_guard.reason"] == "cycle"
    assert attributes(first)["otel_guard.mode"] == "observe"
    assert [e.name for e in first.events] == ["otel_guard.would_refuse"]


# -- the server alone ---------------------------------------------------------------------------


def chain_headers(*agents: str) -> dict[str, str]:
    """Headers that carry a chain through ``agents``, the way any OpenTelemetry client sends them."""
    headers: dict[str, str] = {}
    hops = [otel_guard.delegate(agent) for agent in agents]
    for hop in hops:
        hop.__enter__()
    propagate.inject(headers)
    for hop in reversed(hops):
        hop.__exit__(None, None, None)
    return headers


@pytest.mark.parametrize(
    ("method", "legacy"),
    [
        ("SendMessage", False),
        ("SendStreamingMessage", False),
        ("SendMessage", True),
        ("SendStreamingMessage", True),
    ],
)
async def test_server_refuses_an_arriving_cycle_with_a_jsonrpc_error(
    instrumented: A2AInstrumentor,
    spans: Any,
    start_agents: Callable[..., Agents],
    method: str,
    legacy: bool,
) -> None:
    """A client without otel-guard sends the chain planner -> budget: only the server stands."""
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents(JSONRPC, method == "SendStreamingMessage", legacy)
    body = {
        "jsonrpc": "2.0",
        "id": "call-1",
        "method": method,
        "params": MessageToDict(request("the itinerary, please", "itinerary")),
    }
    headers = {**chain_headers("planner", "budget"), "A2A-Version": "1.0"}

    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        response = await client.post(f"{agents.planner}/", json=body, headers=headers)

    assert agents.ran == []  # the executor never ran
    assert response.status_code == 200  # JSON-RPC over HTTP: the error is in the body
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": "call-1",
        "error": {
            "code": -32099,
            "message": REFUSED_TEXT,
            "data": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "A2A_DELEGATION_CYCLE",
                    "domain": "otel-guard",
                    "metadata": {
                        "code": "a2a_delegation_cycle",
                        "reason": "cycle",
                        "status": "409",
                        "retryable": "false",
                        "agent": "planner",
                        "skill": "itinerary",
                    },
                }
            ],
        },
    }
    (refused,) = [
        s for s in hop_spans(spans) if s.kind is SpanKind.INTERNAL and "a2a.method.name" in attributes(s)
    ]
    assert attributes(refused)["otel_guard.decision"] == "refuse"
    assert attributes(refused)["otel_guard.chain.agents"] == ("planner", "budget", "planner")


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
async def test_server_refuses_an_arriving_cycle_with_http_409_over_rest(
    instrumented: A2AInstrumentor, start_agents: Callable[..., Agents], streaming: bool
) -> None:
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents(REST, streaming)
    path = "/rest/message:stream" if streaming else "/rest/message:send"
    headers = {**chain_headers("planner", "budget"), "A2A-Version": "1.0"}

    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        response = await client.post(
            agents.planner + path,
            json=MessageToDict(request("the itinerary, please", "itinerary")),
            headers=headers,
        )

    assert agents.ran == []
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["status"], error["message"]) == (409, "ABORTED", REFUSED_TEXT)
    assert error["details"][0]["metadata"]["code"] == "a2a_delegation_cycle"


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_client_raises_a_remote_refusal_as_a2a_delegation_refused(
    instrumented: A2AInstrumentor, start_agents: Callable[..., Agents], binding: str
) -> None:
    """A bootstrap card has no name, so this client adds no hop: the server refuses, the client
    raises the refusal as the same class a local refusal is."""
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents(binding)
    url = agents.planner + ("/rest" if binding == REST else "/")
    factory = ClientFactory(ClientConfig(streaming=False, supported_protocol_bindings=[binding]))
    client = factory.create(minimal_agent_card(url, [binding]))

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
    assert type(err).__name__ == "A2ADelegationRefused"
    assert (err.code, err.reason, err.status, err.retryable) == (
        "a2a_delegation_cycle",
        "cycle",
        409,
        False,
    )
    assert err.remote is True  # type: ignore[attr-defined]
    assert (err.hop.agent, err.hop.skill) == ("planner", "itinerary")
    assert str(err) == REFUSED_TEXT
    assert agents.ran == []


async def test_server_refuses_a_chain_signed_with_another_key_even_in_observe_mode(
    instrumented: A2AInstrumentor, start_agents: Callable[..., Agents]
) -> None:
    ours, theirs = generate_key(), generate_key()
    otel_guard.configure(keys=f"{theirs[0]}:{theirs[1]}")
    headers = {**chain_headers("budget"), "A2A-Version": "1.0"}
    otel_guard.configure(keys=f"{ours[0]}:{ours[1]}", mode="observe")
    agents = start_agents()
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "SendMessage",
        "params": MessageToDict(request("plan", "plan")),
    }
    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        response = await client.post(f"{agents.planner}/", json=body, headers=headers)

    assert agents.ran == []
    error = response.json()["error"]
    assert error["code"] == -32099
    assert error["data"][0]["metadata"]["code"] == "a2a_delegation_invalid"
    assert error["data"][0]["metadata"]["reason"] == "bad_signature"


# -- suppression and uninstrument ---------------------------------------------------------------


async def test_suppressed_instrumentation_makes_no_hop_and_sends_no_chain(
    instrumented: A2AInstrumentor, spans: Any, start_agents: Callable[..., Agents]
) -> None:
    agents = start_agents()

    # hops=MAX_HOPS: Budget answers without asking Planner, and records the chain that arrived.
    with otel_guard.delegate("planner"):
        with suppress_instrumentation():
            await ask(agents.budget, "price this", "price", hops=MAX_HOPS)
        clients = [s for s in hop_spans(spans) if s.kind is SpanKind.CLIENT]

    assert clients == []  # no client hop
    # The server (not suppressed: another context) checked budget as the first hop of a new chain:
    # no chain came with the request.
    assert agents.ran == [{"agent": "budget", "skill": "price", "hops": MAX_HOPS, "chain": ["budget"]}]


async def test_uninstrument_restores_the_sdk_and_the_loop_runs_unguarded(
    spans: Any, start_agents: Callable[..., Agents]
) -> None:
    originals = {target: resolve(target) for target in PATCH_TARGETS}
    instrumentor = A2AInstrumentor()
    instrumentor.instrument()
    assert all(resolve(target) is not originals[target] for target in PATCH_TARGETS)
    instrumentor.uninstrument()
    assert {target: resolve(target) for target in PATCH_TARGETS} == originals
    otel_guard.configure(cycle_rule="agent")
    agents = start_agents()

    answer = await agents.ask_planner()

    assert [r["hops"] for r in agents.ran] == list(range(1, MAX_HOPS + 1))
    assert all(r["chain"] is None for r in agents.ran)
    assert "Refused" not in answer
    assert hop_spans(spans) == []


async def test_an_app_built_while_instrumented_is_unguarded_after_uninstrument(
    spans: Any, start_agents: Callable[..., Agents]
) -> None:
    """Starlette keeps the bound dispatch method it took while instrumented; it calls through."""
    instrumentor = A2AInstrumentor()
    instrumentor.instrument()
    try:
        agents = start_agents()
    finally:
        instrumentor.uninstrument()
    otel_guard.configure(cycle_rule="agent")

    await agents.ask_planner()

    assert len(agents.ran) == MAX_HOPS
    assert hop_spans(spans) == []


def test_every_patch_target_exists_in_the_installed_sdk() -> None:
    for target in PATCH_TARGETS:
        assert callable(resolve(target))  # resolve raises LookupError naming a missing target


async def test_a_dispatchers_reply_never_carries_the_chain(instrumented: Any) -> None:
    """Whatever put the caller's context into the response headers, the A2A dispatcher's reply
    leaves without the chain; other baggage members stay."""
    from starlette.responses import JSONResponse

    from otel_guard.instrumentation.a2a._server import continue_caller

    class Request:
        scope: ClassVar[dict[str, object]] = {"headers": []}

    async def dispatch(request: object) -> JSONResponse:
        return JSONResponse({}, headers={"baggage": "otel_guard.chain=eyJhbGciOiJub25lIn0.e30.,tenant=acme"})

    async def chain_only(request: object) -> JSONResponse:
        return JSONResponse({}, headers={"baggage": "otel_guard.chain=eyJhbGciOiJub25lIn0.e30."})

    mixed = await continue_caller(dispatch, None, (Request(),), {})
    alone = await continue_caller(chain_only, None, (Request(),), {})
    assert mixed.headers["baggage"] == "tenant=acme"
    assert "baggage" not in alone.headers


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "streaming"])
@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_send_awaits_a_redis_that_does_not_answer_and_the_loop_runs_on(
    instrumented: A2AInstrumentor,
    start_agents: Callable[..., Agents],
    tmp_path: Path,
    streaming: bool,
    on_error: str,
) -> None:
    """The client's hop (every send is a stream of events) waits for a paused Redis on the event
    loop without holding it, then answers per ``budget_on_error``."""
    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        agents = start_agents(JSONRPC, streaming)
        assert await agents.ask_planner(hops=MAX_HOPS)  # the store's clients are connected
        async with paused_under_probe(redis) as probe:
            if on_error == "allow":
                answer = await agents.ask_planner(hops=MAX_HOPS)
            else:
                with pytest.raises(A2ADelegationRefused) as refused:
                    await agents.ask_planner(hops=MAX_HOPS)
    probe.assert_the_hop_waited_not_the_loop()
    if on_error == "allow":
        assert answer.startswith("plan: ")
        assert agents.executions() == [("planner", "plan"), ("planner", "plan")]
    else:
        assert refused.value.reason == "budget"
        assert not refused.value.remote
        assert agents.executions() == [("planner", "plan")]  # refused before it was sent
