"""The HTTP clients' instrumentor (``otel_guard_http``) on its own: what it reads as a refusal and what
it leaves alone, the chain on the way out, and a client it cannot guard.

A Starlette app on uvicorn (127.0.0.1) answers with whatever status and body a test asks for; httpx,
requests and aiohttp call it, each through the guard's patch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
import requests
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import otel_guard
from otel_guard.instrumentation import http as http_instrumentation
from otel_guard.instrumentation.http import HTTPClientsInstrumentor
from otel_guard.instrumentation.http._refusals import MAX_MESSAGE, remote_refusal
from tests.core.asgi_server import serving
from tests.instrumentation.instrumentors import instrumentor_fixture

pytestmark = pytest.mark.integration

http_guarded = instrumentor_fixture(HTTPClientsInstrumentor)

CYCLE = {
    "error": "a2a_delegation_cycle",
    "reason": "cycle",
    "message": "Delegation cycle: agent planner is already in chain planner → budget",
    "agent": "planner",
    "skill": "plan",
}


async def answer(request: Request) -> Response:
    """Answers with the status, content type and body the request's JSON names; ``/baggage`` echoes
    the baggage header it got; ``/stream`` streams the body with no length."""
    if request.url.path == "/baggage":
        return Response(request.headers.get("baggage", ""), media_type="text/plain")
    asked = await request.json()
    body = asked["body"].encode()
    if request.url.path == "/stream":
        return StreamingResponse(iter([body]), status_code=asked["status"], media_type=asked["type"])
    return Response(body, status_code=asked["status"], media_type=asked["type"])


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = Starlette(routes=[Route(p, answer, methods=["POST", "GET"]) for p in ("/", "/stream", "/baggage")])
    with serving(app) as base:
        yield base


def call(client: str, url: str, status: int, body: str, media: str = "application/json") -> tuple[int, bytes]:
    """POST the answer wanted with ``client``; its status and body as the app would read them."""
    asked = {"status": status, "type": media, "body": body}
    if client == "httpx":
        response = httpx.post(url, json=asked, timeout=30)
        return response.status_code, response.content
    if client == "requests":
        answered = requests.post(url, json=asked, timeout=30)
        return answered.status_code, answered.content

    async def with_aiohttp() -> tuple[int, bytes]:
        async with aiohttp.ClientSession() as session, session.post(url, json=asked) as response:
            return response.status, await response.read()

    return asyncio.run(with_aiohttp())


CLIENTS = ["httpx", "requests", "aiohttp"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_guards_409_is_raised_as_a_remote_refusal(
    http_guarded: HTTPClientsInstrumentor, url: str, client: str
) -> None:
    with pytest.raises(otel_guard.DelegationRefused) as refused:
        call(client, url, 409, json.dumps(CYCLE))
    err = refused.value
    assert (err.remote, err.reason, err.code, err.status, err.retryable) == (
        True,
        "cycle",
        "a2a_delegation_cycle",
        409,
        False,
    )
    assert (err.hop.agent, err.hop.skill, err.chain) == ("planner", "plan", None)
    assert str(err) == CYCLE["message"]


NOT_REFUSALS = {
    "the app's own conflict": (409, json.dumps({"detail": "the booking already exists"}), "application/json"),
    "an A2A REST error (its error is an object)": (
        409,
        json.dumps({"error": {"code": 409, "status": "ABORTED", "message": "m"}, "reason": "cycle"}),
        "application/json",
    ),
    "a code that is not the reason's": (
        409,
        json.dumps({**CYCLE, "error": "a2a_delegation_depth"}),
        "application/json",
    ),
    "an unknown reason": (409, json.dumps({**CYCLE, "reason": "boredom"}), "application/json"),
    "no message": (409, json.dumps({**CYCLE, "message": ""}), "application/json"),
    "not JSON": (409, "{not json", "application/json"),
    "a JSON list": (409, json.dumps([CYCLE]), "application/json"),
    "text, not JSON": (409, json.dumps(CYCLE), "text/plain"),
    "another status": (400, json.dumps(CYCLE), "application/json"),
    "a body too long to be a refusal": (409, json.dumps({**CYCLE, "pad": "x" * 20000}), "application/json"),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("case", NOT_REFUSALS, ids=list(NOT_REFUSALS))
def test_anything_else_stays_the_apps_response_with_its_body_whole(
    http_guarded: HTTPClientsInstrumentor, url: str, client: str, case: str
) -> None:
    status, body, media = NOT_REFUSALS[case]
    assert call(client, url, status, body, media) == (status, body.encode())


def test_a_streamed_409_of_unknown_length_is_left_unread(
    http_guarded: HTTPClientsInstrumentor, url: str
) -> None:
    """A body the app means to stream is never read by the guard (it could be endless)."""
    asked = {"status": 409, "type": "application/json", "body": json.dumps(CYCLE)}
    with httpx.stream("POST", f"{url}/stream", json=asked, timeout=30) as response:
        assert response.status_code == 409
        assert not response.is_stream_consumed
        assert json.loads(response.read()) == CYCLE


def test_a_refusals_message_is_bounded_and_bad_names_fall_back() -> None:
    body = {**CYCLE, "message": "m" * 5000, "agent": "bad\x00name", "skill": 7}
    err = remote_refusal(json.dumps(body).encode(), lambda: "pricing.internal")
    assert err is not None
    assert len(str(err)) == MAX_MESSAGE
    assert (err.hop.agent, err.hop.skill) == ("pricing.internal", None)


@pytest.mark.parametrize("client", CLIENTS)
def test_the_chain_leaves_with_every_client_without_opentelemetrys_own(
    http_guarded: HTTPClientsInstrumentor, url: str, client: str
) -> None:
    """No OpenTelemetry client instrumentation is on here: the guard's own member carries the chain,
    added to a baggage header the app set itself, and never added twice."""
    headers = {"baggage": "tenant=acme"}
    with otel_guard.delegate("planner"):
        if client == "httpx":
            got = httpx.get(f"{url}/baggage", headers=headers, timeout=30).text
        elif client == "requests":
            got = requests.get(f"{url}/baggage", headers=headers, timeout=30).text
        else:

            async def with_aiohttp() -> str:
                async with (
                    aiohttp.ClientSession(headers=headers) as session,
                    session.get(f"{url}/baggage") as r,
                ):
                    return await r.text()

            got = asyncio.run(with_aiohttp())
    tenant, member = got.split(",")
    assert tenant == "tenant=acme"
    assert member.startswith("otel_guard.chain=ey")
    from otel_guard.chain import decode

    assert decode(member.split("=", 1)[1], None).agents == ("planner",)
    # Outside any hop nothing is added.
    assert httpx.get(f"{url}/baggage", headers=headers, timeout=30).text == "tenant=acme"


def test_a_client_it_cannot_find_is_said_once_and_left_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, url: str
) -> None:
    monkeypatch.setitem(
        http_instrumentation.CLIENTS,
        "requests",
        ((("requests.sessions", "Session.no_such_send"), "guard_send"),),
    )
    instrumentor = HTTPClientsInstrumentor()
    with caplog.at_level(logging.WARNING, logger="otel_guard"):
        instrumentor.instrument()
    try:
        said = [r.getMessage() for r in caplog.records if "not guarded" in r.getMessage()]
        assert len(said) == 1
        assert said[0].startswith("otel-guard: calls through requests are not guarded")
        assert "Session.no_such_send" in said[0]
        # httpx is guarded all the same; requests is left as it was.
        with pytest.raises(otel_guard.DelegationRefused):
            call("httpx", url, 409, json.dumps(CYCLE))
        assert call("requests", url, 409, json.dumps(CYCLE))[0] == 409
    finally:
        with contextlib.suppress(Exception):
            instrumentor.uninstrument()


def test_uninstrument_takes_every_patch_off(url: str) -> None:
    instrumentor = HTTPClientsInstrumentor()
    instrumentor.instrument()
    instrumentor.uninstrument()
    for client in CLIENTS:
        assert call(client, url, 409, json.dumps(CYCLE))[0] == 409
