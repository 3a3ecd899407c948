"""No chain token reaches a log, whatever the size of the baggage it came in.

OpenTelemetry's W3C baggage propagator logs a header it drops for its size (over 8,192 bytes) whole,
and a list member it cannot read as it is, at WARNING. Every path the guard extracts a chain through
is tried with a real signed token in such a header: the live ASGI middleware (uvicorn on 127.0.0.1,
httpx), a dict of headers or gRPC metadata (the A2A server), an MCP request's ``_meta``.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import httpx
import pytest
from opentelemetry import baggage, context, propagate

import otel_guard
from otel_guard import delegate
from otel_guard._carriers import attach_caller_context
from otel_guard.asgi import GuardMiddleware
from otel_guard.instrumentation.mcp._carrier import context_from_meta
from tests.core.asgi_server import serving

CHAIN_KEY = "otel_guard.chain"
LOG_BYTES = 1024
RUN = 100


def captured_token() -> tuple[str, str]:
    """A chain token signed with the configured key, and the chain's root."""
    headers: dict[str, str] = {}
    with delegate("planner") as hop:
        propagate.inject(headers)
    member = headers["baggage"]
    assert member.startswith(f"{CHAIN_KEY}=")
    assert hop.chain is not None
    return member.removeprefix(f"{CHAIN_KEY}="), hop.chain.root


def baggage_of(size: int, token: str) -> str:
    """A baggage header of ``size`` bytes whose first member is the chain (the rest other members)."""
    header = f"{CHAIN_KEY}={token}"
    members = [header]
    length = len(header)
    while length < size:
        member = f"m{len(members)}={secrets.token_hex(24)}"
        members.append(member)
        length += 1 + len(member)
    return ",".join(members)[:size]


CLIENT_LOGGERS = ("httpx", "httpcore", "asyncio")
"""The test's own client's debug records: not what the server logs (they never hold a header)."""


def assert_nothing_of(header: str, token: str, records: list[logging.LogRecord]) -> None:
    """No record holds the token or any 100-byte run of the header, and the server's are short."""
    messages = [record.getMessage() for record in records]
    served = [r.getMessage() for r in records if not r.name.startswith(CLIENT_LOGGERS)]
    assert sum(len(message) for message in served) < LOG_BYTES, served
    for message in messages:
        assert token not in message
        runs = {message[start : start + RUN] for start in range(len(message) - RUN + 1)}
        assert not any(run in header for run in runs), message


@pytest.fixture
def token(key: Any) -> tuple[str, str]:
    return captured_token()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# -- the live middleware ---------------------------------------------------------------------------


def chain_app(seen: list[Any]) -> GuardMiddleware:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        chain = otel_guard.current_chain()
        seen.append(None if chain is None else (chain.root, [list(hop) for hop in chain.hops]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return GuardMiddleware(app, agent="budget")


@pytest.mark.integration
@pytest.mark.parametrize("size", [9 * 1024, 1024 * 1024])
async def test_an_oversize_baggage_header_is_dropped_and_never_logged(
    token: tuple[str, str], logs: pytest.LogCaptureFixture, size: int
) -> None:
    text, root = token
    header = baggage_of(size, text)
    seen: list[Any] = []
    # h11 takes at most 16 KiB of headers by default; a server that takes more is what this is about.
    with serving(chain_app(seen), lifespan="off", h11_max_incomplete_event_size=4 * 1024 * 1024) as url:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.get(f"{url}/price", headers={"baggage": header})
    assert response.status_code == 200
    # The header is dropped whole (the W3C limit), the chain with it: the request starts a new tree.
    ((new_root, hops),) = seen
    assert new_root != root
    assert hops == [["budget", None]]
    warned = [
        r for r in logs.records if r.levelno == logging.WARNING and not r.name.startswith(CLIENT_LOGGERS)
    ]
    assert warned, "the dropped header is reported"
    assert_nothing_of(header, text, logs.records)


# -- the carriers of the A2A server (headers, gRPC metadata) and of MCP (_meta) ---------------------


@pytest.mark.parametrize("size", [9 * 1024, 1024 * 1024])
def test_a_dict_carrier_with_an_oversize_baggage_is_read_once_and_never_logged(
    token: tuple[str, str], logs: pytest.LogCaptureFixture, size: int
) -> None:
    text, _ = token
    header = baggage_of(size, text)
    attached = attach_caller_context({"baggage": header})
    try:
        assert baggage.get_baggage(CHAIN_KEY) is None
    finally:
        if attached is not None:
            context.detach(attached)
    assert len(logs.records) == 1  # extracted once: one warning
    assert_nothing_of(header, text, logs.records)


@pytest.mark.parametrize("size", [9 * 1024, 1024 * 1024])
def test_an_mcp_meta_with_an_oversize_baggage_is_read_once_and_never_logged(
    token: tuple[str, str], logs: pytest.LogCaptureFixture, size: int
) -> None:
    text, _ = token
    header = baggage_of(size, text)
    ctx = context_from_meta({"baggage": header, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert baggage.get_baggage(CHAIN_KEY, ctx) is None
    assert len(logs.records) == 1
    assert_nothing_of(header, text, logs.records)


def test_a_chain_member_the_propagator_cannot_read_is_not_logged(
    token: tuple[str, str], logs: pytest.LogCaptureFixture
) -> None:
    text, _ = token
    header = f"{CHAIN_KEY}={text}\\"  # a backslash is no baggage character: the member is dropped
    attached = attach_caller_context({"baggage": header})
    if attached is not None:
        context.detach(attached)
    assert logs.records
    assert_nothing_of(header, text, logs.records)
