"""GuardMiddleware behind a middleware that has already extracted the caller's context, as
OpenTelemetry's ASGI middleware does: the chain is taken from the context (the headers are not read
again), and it is verified all the same.

Served by uvicorn on 127.0.0.1 and called with httpx, as in ``tests/test_asgi.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind

import otel_guard
from otel_guard.asgi import GuardMiddleware
from otel_guard.chain import generate_key
from tests.test_asgi import Budget, budget_app, chain_headers, ended_hops, post, serve_asgi

pytestmark = pytest.mark.integration

__all__ = ["serve_asgi"]  # the fixture, used here by name


def extracting(app: Any) -> Any:
    """``app`` behind a server middleware that extracts the caller's context from the headers
    (``traceparent`` and ``baggage``, the global propagator) and starts a SERVER span in it."""
    tracer = trace.get_tracer("test")

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        token = context.attach(propagate.extract(carrier))
        try:
            with tracer.start_as_current_span("POST /quote", kind=SpanKind.SERVER):
                await app(scope, receive, send)
        finally:
            context.detach(token)

    return outer


async def test_the_chain_in_the_extracted_context_is_extended(
    spans: Any, serve_asgi: Callable[[Any], str]
) -> None:
    budget = Budget()
    url = serve_asgi(extracting(GuardMiddleware(budget_app(budget), agent="budget")))

    response = await post(f"{url}/quote", chain_headers("planner"))

    assert response.status_code == 200
    assert response.json()["chain"] == [["planner", None], ["budget", None]]
    assert response.json()["onward_carries_chain"] is True
    (hop,) = await ended_hops(spans)
    (server_span,) = spans.named("POST /quote")
    assert hop.parent is not None
    assert hop.parent.span_id == server_span.context.span_id


async def test_the_chain_in_the_extracted_context_is_verified(serve_asgi: Callable[[Any], str]) -> None:
    theirs, ours = generate_key(), generate_key()
    otel_guard.configure(keys=f"{theirs[0]}:{theirs[1]}")
    headers = chain_headers("planner")
    otel_guard.configure(keys=f"{ours[0]}:{ours[1]}")
    budget = Budget()
    url = serve_asgi(extracting(GuardMiddleware(budget_app(budget), agent="budget")))

    response = await post(f"{url}/quote", headers)

    assert response.status_code == 409
    assert response.json()["reason"] == "bad_signature"
    assert budget.seen == []
