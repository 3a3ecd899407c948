"""GuardMiddleware: a Starlette app served by uvicorn on 127.0.0.1, called with httpx and websockets.

The app is Budget, a plain-HTTP agent. Every request to it is one hop into ``budget``; the tests
send the chain the way any OpenTelemetry client does, in the ``baggage`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect

import otel_guard
from otel_guard.asgi import GuardMiddleware
from otel_guard.chain import generate_key
from tests.core.asgi_server import serving

pytestmark = pytest.mark.integration

CALL_SECONDS = 30.0


@dataclass
class Budget:
    """What the app saw: one entry per request that reached it, and whether its lifespan ran."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    started: bool = False


def budget_app(budget: Budget) -> Starlette:
    async def price(request: Request) -> JSONResponse:
        chain = otel_guard.current_chain()
        onward: dict[str, str] = {}
        propagate.inject(onward)  # what an onward call from here would carry
        seen = {
            "path": request.url.path,
            "chain": None if chain is None else [[h.agent, h.skill] for h in chain.hops],
            "onward_carries_chain": "otel_guard.chain=" in onward.get("baggage", ""),
        }
        budget.seen.append(seen)
        if request.url.path == "/fail":
            raise RuntimeError("the pricing backend is down")
        return JSONResponse(seen)

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        budget.started = True
        yield

    return Starlette(
        routes=[
            Route("/price", price, methods=["POST"]),
            Route("/quote", price, methods=["POST"]),
            Route("/fail", price, methods=["POST"]),
            WebSocketRoute("/echo", echo),
        ],
        lifespan=lifespan,
    )


def skill_from_path(scope: Any) -> str | None:
    return {"/price": "price", "/fail": "price"}.get(scope["path"])


@dataclass
class Served:
    url: str
    budget: Budget


@pytest.fixture
def serve_asgi() -> Iterator[Callable[[Any], str]]:
    """Serve an ASGI app on uvicorn in a thread of this process; stopped at teardown."""
    with contextlib.ExitStack() as servers:
        yield lambda app: servers.enter_context(serving(app))


@pytest.fixture
def serve(serve_asgi: Callable[[Any], str]) -> Callable[..., Served]:
    """Serve Budget behind the middleware (``app.add_middleware(GuardMiddleware, ...)``)."""

    def start(**middleware: Any) -> Served:
        budget = Budget()
        app = budget_app(budget)
        app.add_middleware(GuardMiddleware, **{"agent": "budget", **middleware})
        return Served(serve_asgi(app), budget)

    return start


CALLER_HOPS: set[int] = set()
"""The span ids of the hops :func:`chain_headers` made: the caller's, never the middleware's."""


def chain_headers(*agents: str) -> dict[str, str]:
    """The headers an OpenTelemetry client sends from inside hops through ``agents``."""
    headers: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for agent in agents:
            hop = stack.enter_context(otel_guard.delegate(agent))
            CALLER_HOPS.add(hop.span.get_span_context().span_id)
        propagate.inject(headers)
    return headers


async def post(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        return await client.post(url, headers=headers or {}, json={"draft": "3 days in Lisbon"})


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def server_hops(spans: Any) -> list[ReadableSpan]:
    """The middleware's hops: INTERNAL spans (the agent runs here) that are not the test's own, made
    by :func:`chain_headers` or inside another hop of the test."""
    by_id = {s.context.span_id: s for s in spans.all()}

    def received(span: ReadableSpan) -> bool:
        if span.context.span_id in CALLER_HOPS:
            return False
        parent = span.parent
        local = by_id.get(parent.span_id) if parent is not None and not parent.is_remote else None
        return local is None or local.kind is SpanKind.SERVER

    return [s for s in spans.named("invoke_agent budget") if s.kind is SpanKind.INTERNAL and received(s)]


async def ended_hops(spans: Any, count: int = 1) -> list[ReadableSpan]:
    """The server hop spans once ``count`` have ended: the server ends a hop just after the app
    has sent its response, so the client may read the response first."""
    deadline = time.monotonic() + 5
    while len(server_hops(spans)) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return server_hops(spans)


async def test_a_first_request_is_a_new_chain_into_the_agent(
    spans: Any, serve: Callable[..., Served]
) -> None:
    served = serve(skill=skill_from_path)

    response = await post(f"{served.url}/price")

    assert response.status_code == 200
    assert response.json() == {
        "path": "/price",
        "chain": [["budget", "price"]],
        "onward_carries_chain": True,
    }
    (span,) = await ended_hops(spans)
    root = attributes(span)["otel_guard.chain.root"]
    assert attributes(span) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "budget",
        "otel_guard.skill": "price",
        "otel_guard.chain.agents": ("budget",),
        "otel_guard.chain.skills": ("price",),
        "otel_guard.chain.root": root,
        "otel_guard.chain.depth": 1,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 1,
    }


async def test_a_cycle_is_answered_with_409_before_the_app_runs(
    spans: Any, serve: Callable[..., Served]
) -> None:
    otel_guard.configure(cycle_rule="agent")
    served = serve(skill=skill_from_path)

    response = await post(f"{served.url}/price", chain_headers("budget", "planner"))

    assert response.status_code == 409
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert response.json() == {
        "error": "a2a_delegation_cycle",
        "reason": "cycle",
        "message": "Delegation cycle: agent budget is already in chain budget → planner",
        "agent": "budget",
        "skill": "price",
    }
    assert served.budget.seen == []  # the app never ran
    (span,) = await ended_hops(spans)
    assert attributes(span)["otel_guard.decision"] == "refuse"
    assert attributes(span)["otel_guard.chain.agents"] == ("budget", "planner", "budget")
    assert [e.name for e in span.events] == ["otel_guard.refused"]


async def test_a_hop_the_caller_already_added_is_checked_not_added_twice(
    spans: Any, serve: Callable[..., Served]
) -> None:
    served = serve(skill=skill_from_path)
    headers: dict[str, str] = {}
    with otel_guard.delegate("planner", "plan"), otel_guard.delegate("budget", "price"):
        propagate.inject(headers)

    response = await post(f"{served.url}/price", headers)

    assert response.status_code == 200
    assert response.json()["chain"] == [["planner", "plan"], ["budget", "price"]]
    (span,) = await ended_hops(spans)
    assert attributes(span)["otel_guard.chain.depth"] == 2


async def test_the_caller_trace_continues(spans: Any, serve: Callable[..., Served]) -> None:
    served = serve()
    headers: dict[str, str] = {}
    with otel_guard.delegate("planner") as caller:
        propagate.inject(headers)
        caller_context = caller.span.get_span_context()

    await post(f"{served.url}/quote", headers)

    (span,) = await ended_hops(spans)
    assert span.context.trace_id == caller_context.trace_id
    assert span.parent is not None
    assert span.parent.span_id == caller_context.span_id
    assert "otel_guard.skill" not in attributes(span)  # no skill configured


async def test_an_outer_opentelemetry_middleware_keeps_its_server_span_as_the_parent(
    spans: Any, serve_asgi: Callable[[Any], str]
) -> None:
    """With a server span already current (an OpenTelemetry ASGI middleware outside this one), the
    hop is its child, and the chain still comes from the headers."""
    tracer = trace.get_tracer("test")
    guarded = GuardMiddleware(budget_app(Budget()), agent="budget")

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await guarded(scope, receive, send)
            return
        with tracer.start_as_current_span("POST /quote", kind=SpanKind.SERVER):
            await guarded(scope, receive, send)

    url = serve_asgi(outer)
    response = await post(f"{url}/quote", chain_headers("planner"))

    assert response.json()["chain"] == [["planner", None], ["budget", None]]
    (hop,) = await ended_hops(spans)
    (outer_span,) = spans.named("POST /quote")
    assert hop.parent is not None
    assert hop.parent.span_id == outer_span.context.span_id


async def test_the_chain_is_read_even_when_the_propagators_leave_baggage_out(
    serve: Callable[..., Served],
) -> None:
    otel_guard.configure(cycle_rule="agent")
    headers = chain_headers("budget", "planner")  # sent by a client whose propagators carry baggage
    served = serve()
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())  # OTEL_PROPAGATORS=tracecontext
    try:
        response = await post(f"{served.url}/quote", headers)
    finally:
        propagate.set_global_textmap(previous)

    assert response.status_code == 409
    assert served.budget.seen == []


async def test_observe_mode_lets_the_cycle_through_and_records_would_refuse(
    spans: Any, serve: Callable[..., Served]
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    served = serve()

    response = await post(f"{served.url}/quote", chain_headers("budget", "planner"))

    assert response.status_code == 200
    assert response.json()["chain"] == [["budget", None], ["planner", None], ["budget", None]]
    (span,) = await ended_hops(spans)
    assert attributes(span)["otel_guard.decision"] == "would_refuse"
    assert attributes(span)["otel_guard.reason"] == "cycle"
    assert [e.name for e in span.events] == ["otel_guard.would_refuse"]


async def test_a_chain_signed_with_another_key_is_refused_even_in_observe_mode(
    serve: Callable[..., Served],
) -> None:
    theirs, ours = generate_key(), generate_key()
    otel_guard.configure(keys=f"{theirs[0]}:{theirs[1]}")
    headers = chain_headers("planner")
    otel_guard.configure(keys=f"{ours[0]}:{ours[1]}", mode="observe")
    served = serve()

    response = await post(f"{served.url}/quote", headers)

    assert response.status_code == 409
    assert response.json()["error"] == "a2a_delegation_invalid"
    assert response.json()["reason"] == "bad_signature"
    assert served.budget.seen == []


async def test_a_chain_too_deep_is_refused_and_the_message_names_the_limit(
    serve: Callable[..., Served],
) -> None:
    otel_guard.configure(max_depth=2)
    served = serve()

    response = await post(f"{served.url}/quote", chain_headers("planner", "fx"))

    assert response.status_code == 409
    body = response.json()
    assert (body["error"], body["reason"]) == ("a2a_delegation_depth", "depth")
    assert body["message"] == (
        "Delegation depth: calling agent budget would make chain planner → fx 3 hops long; "
        "the limit (max_depth) is 2"
    )


async def test_an_app_error_is_recorded_on_the_hop_and_still_reaches_the_server(
    spans: Any, serve: Callable[..., Served]
) -> None:
    served = serve(skill=skill_from_path)

    response = await post(f"{served.url}/fail")

    assert response.status_code == 500
    (span,) = await ended_hops(spans)
    assert span.status.status_code is trace.StatusCode.ERROR
    assert attributes(span)["error.type"] == "RuntimeError"
    assert [e.name for e in span.events] == ["exception"]


async def test_websocket_and_lifespan_pass_through(spans: Any, serve: Callable[..., Served]) -> None:
    otel_guard.configure(cycle_rule="agent")
    served = serve()
    assert served.budget.started  # the lifespan scope reached the app

    ws_url = served.url.replace("http://", "ws://") + "/echo"
    # A chain that would be refused over HTTP: a websocket is not guarded, so it goes through.
    async with (
        asyncio.timeout(CALL_SECONDS),
        connect(ws_url, additional_headers=chain_headers("budget")) as websocket,
    ):
        await websocket.send("hello")
        assert await websocket.recv() == "hello"
    assert server_hops(spans) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"agent": ""}, "agent must be a non-empty string"),
        ({"agent": "budget", "skill": 3}, "skill must be a string, None or a callable"),
    ],
)
def test_bad_options_are_refused_with_a_clear_error(options: dict[str, Any], message: str) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never runs
        raise AssertionError

    with pytest.raises(ValueError, match=message):
        GuardMiddleware(app, **options)


async def test_a_reply_never_carries_the_chain(spans: Any, serve_asgi: Callable[[Any], str]) -> None:
    """An app that injects its context into its response headers (some frameworks do, to let the
    client join the trace) would hand the client a freshly signed token one hop longer: the
    middleware takes the chain out of the reply's baggage, and keeps the rest."""

    async def echo_context(request: Request) -> JSONResponse:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        headers["baggage"] = f"{headers['baggage']},tenant=acme"
        return JSONResponse({"ok": True}, headers=headers)

    async def only_the_chain(request: Request) -> JSONResponse:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        return JSONResponse({"ok": True}, headers=headers)

    app = Starlette(routes=[Route("/echo", echo_context), Route("/only", only_the_chain)])
    url = serve_asgi(GuardMiddleware(app, agent="budget"))
    async with httpx.AsyncClient() as client:
        echoed = await client.get(f"{url}/echo", headers=chain_headers("planner"))
        alone = await client.get(f"{url}/only", headers=chain_headers("planner"))
    assert echoed.status_code == alone.status_code == 200
    assert "traceparent" in echoed.headers  # the app's own propagation is left alone ...
    assert echoed.headers["baggage"] == "tenant=acme"  # ... but for the chain
    assert "baggage" not in alone.headers
