"""The context a server runs an MCP request in, read from the request's ``_meta`` (mcp/_carrier.py).

``_meta`` is the only source of the chain, and the extraction MCP's own server span made of the very
same ``_meta`` is the one used: these pin both, with real propagators and a real signed token.
"""

from __future__ import annotations

from typing import Any

from mcp.shared._otel import extract_trace_context
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import otel_guard
from otel_guard.instrumentation.mcp._carrier import context_from_meta, remembering_extraction
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def meta_from(*path: str, **extra: str) -> dict[str, Any]:
    """The ``_meta`` a client sends from inside the hops ``path``, with ``extra`` baggage members."""
    meta: dict[str, Any] = {}
    ctx = context.get_current()
    for key, value in extra.items():
        ctx = baggage.set_baggage(key, value, ctx)
    token = context.attach(ctx)
    try:
        hops = [otel_guard.delegate(name, kind="tool") for name in path]
        tokens = [context.attach(hop.start()) for hop in hops]
        propagate.inject(meta)
        for hop, attached in zip(reversed(hops), reversed(tokens), strict=True):
            context.detach(attached)
            hop.finish()
    finally:
        context.detach(token)
    return meta


def chain_in(ctx: context.Context) -> tuple[str, ...] | None:
    attached = context.attach(ctx)
    try:
        chain = otel_guard.current_chain()
    finally:
        context.detach(attached)
    return chain.agents if chain is not None else None


def left_over() -> context.Context:
    """A server task's context that still holds an earlier request's chain."""
    with otel_guard.delegate("earlier", kind="tool") as hop:
        assert hop.context is not None
        return hop.context


def test_the_chain_comes_from_meta_alone(spans: Any) -> None:
    inherited = left_over()
    assert chain_in(inherited) == ("earlier",)
    assert chain_in(context_from_meta({"traceparent": TRACEPARENT}, inherited)) is None
    assert chain_in(context_from_meta(meta_from("planner"), inherited)) == ("planner",)
    kept = context_from_meta(meta_from("planner", tenant="t1"), inherited)
    assert baggage.get_baggage("tenant", kept) == "t1"


def test_the_servers_own_baggage_stays_and_the_requests_members_replace_its(spans: Any) -> None:
    inherited = baggage.set_baggage("region", "eu", baggage.set_baggage("tenant", "t0", left_over()))
    meta = meta_from("planner", tenant="t1")
    ctx = context_from_meta(meta, inherited)
    # What the public API gives step by step: the chain in force removed, each arriving member set.
    expected = baggage.remove_baggage(CHAIN_BAGGAGE_KEY, inherited)
    for key, value in baggage.get_all(context_from_meta(meta, context.Context())).items():
        expected = baggage.set_baggage(key, value, expected)
    assert dict(baggage.get_all(ctx)) == dict(baggage.get_all(expected))
    assert baggage.get_baggage("region", ctx) == "eu"
    assert baggage.get_baggage("tenant", ctx) == "t1"
    assert chain_in(ctx) == ("planner",)
    without = context_from_meta({"traceparent": TRACEPARENT}, inherited)
    assert dict(baggage.get_all(without)) == {"region": "eu", "tenant": "t0"}


def test_what_mcp_extracted_from_this_meta_is_used_and_only_for_it(spans: Any) -> None:
    meta = meta_from("planner")
    extracted = remembering_extraction(propagate.extract)(meta)
    assert extracted is not None
    ctx = context_from_meta(meta, context.Context())
    assert baggage.get_baggage(CHAIN_BAGGAGE_KEY, ctx) is baggage.get_baggage(CHAIN_BAGGAGE_KEY, extracted)
    # The caller's span is the parent when the current one is not in the caller's trace.
    remote = trace.get_current_span(ctx).get_span_context()
    assert remote.is_remote
    assert remote.trace_id == trace.get_current_span(extracted).get_span_context().trace_id
    # Another _meta with the same content is read afresh, and gives the same chain.
    again = context_from_meta(dict(meta), context.Context())
    assert baggage.get_baggage(CHAIN_BAGGAGE_KEY, again) == baggage.get_baggage(CHAIN_BAGGAGE_KEY, ctx)
    assert baggage.get_baggage(CHAIN_BAGGAGE_KEY, again) is not baggage.get_baggage(
        CHAIN_BAGGAGE_KEY, extracted
    )
    # A _meta whose baggage is not a string is read as the guard reads it, not as MCP's span did.
    odd = {**meta, "baggage": [meta["baggage"]]}
    remembering_extraction(propagate.extract)(odd)
    assert chain_in(context_from_meta(odd, context.Context())) is None


def test_a_chain_in_force_is_not_taken_for_the_requests_whatever_the_propagators_order(spans: Any) -> None:
    """``OTEL_PROPAGATORS=baggage,tracecontext``: the W3C baggage propagator, first, starts from the
    current context when given none; the chain left in a server task's context is still not the
    request's, read by the guard or taken from MCP's extraction."""
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(
        CompositePropagator([W3CBaggagePropagator(), TraceContextTextMapPropagator()])
    )
    try:
        inherited = left_over()
        meta: dict[str, Any] = {"traceparent": TRACEPARENT}
        sent = meta_from("planner")
        assert chain_in(context_from_meta(meta, inherited)) is None
        attached = context.attach(inherited)
        try:
            remembering_extraction(extract_trace_context)(meta)  # as MCP's server span does
            assert chain_in(context_from_meta(meta, inherited)) is None
            remembering_extraction(extract_trace_context)(sent)
            assert chain_in(context_from_meta(sent, inherited)) == ("planner",)
        finally:
            context.detach(attached)
    finally:
        propagate.set_global_textmap(configured)
