"""The OpenTelemetry context in an MCP request's ``_meta``: written by the client, read by the server.

MCP requests carry an open ``_meta`` map, and the MCP specification (SEP-414) puts W3C trace context
there: ``traceparent``, ``tracestate`` and ``baggage`` keys, with the same values as the HTTP headers
of those names. The chain rides in the ``baggage`` key as the member ``otel_guard.chain``.

``_meta`` is the one carrier every transport shares -- stdio, streamable HTTP, and the in-process
pairings, where no HTTP header exists -- so the chain goes there even when the configured
propagators (``OTEL_PROPAGATORS``) leave baggage out: without it a loop through MCP would go unseen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context, get_current
from opentelemetry.trace import NonRecordingSpan

from otel_guard._carriers import propagator_reads_baggage
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

BAGGAGE_KEY: Final = "baggage"
"""The ``_meta`` key of the W3C baggage (the header's name, as SEP-414 uses it)."""

_W3C_BAGGAGE: Final = W3CBaggagePropagator()

try:  # where mcp 2.x keeps it; a version without it gets the context written here, as any other
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher as _JSONRPCDispatcher
except ImportError:  # pragma: no cover - depends on the installed mcp
    _JSONRPCDispatcher = None  # type: ignore[assignment,misc]

_DISPATCHER_ATTRIBUTE: Final = "_dispatcher"  # ClientSession's dispatcher (mcp 2.3); tested


def meta_with_context(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``meta`` with the current context injected: trace context, baggage and the chain.

    The caller's own keys are kept; the propagators' keys (``traceparent``, ``baggage``, ...) are set
    from the current context, as every OpenTelemetry instrumentation does with headers.
    """
    carrier: dict[str, Any] = dict(meta) if meta else {}
    propagate.inject(carrier)
    _add_chain(carrier)
    return carrier


def meta_with_chain(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``meta`` with the chain in force added to its ``baggage`` (for a dispatcher that
    injects the rest itself, under propagators that leave baggage out)."""
    carrier: dict[str, Any] = dict(meta) if meta else {}
    _add_chain(carrier)
    return carrier


def writes_trace_context(session: object) -> bool:
    """Whether ``session`` (a ``ClientSession``) sends through MCP's JSON-RPC dispatcher, which
    injects the current context into every request's ``_meta`` itself (SEP-414), inside its own
    ``MCP send`` span: the configured propagators' keys, the chain's baggage among them."""
    if _JSONRPCDispatcher is None:
        return False
    return isinstance(getattr(session, _DISPATCHER_ATTRIBUTE, None), _JSONRPCDispatcher)


def _add_chain(carrier: dict[str, Any]) -> None:
    """Add the chain in force to ``carrier``'s ``baggage``, where the propagators left it out."""
    chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY)
    if chain is not None and not _carries_chain(carrier.get(BAGGAGE_KEY)):
        # The configured propagators left baggage out: add the chain member alone.
        only_chain: dict[str, str] = {}
        _W3C_BAGGAGE.inject(only_chain, baggage.set_baggage(CHAIN_BAGGAGE_KEY, chain, Context()))
        header = carrier.get(BAGGAGE_KEY)
        member = only_chain[BAGGAGE_KEY]
        carrier[BAGGAGE_KEY] = f"{header},{member}" if isinstance(header, str) and header else member


def context_from_meta(meta: Mapping[str, Any] | None, current: Context | None = None) -> Context:
    """The context a server runs a request in: ``current`` with the baggage of ``meta``.

    ``meta`` is the only source of the chain: a chain left in ``current`` (a server task that
    inherited the context of an earlier request) is removed when ``meta`` carries none, so one
    request's chain never leaks into another's. The span in ``current`` stays the parent when it
    belongs to the caller's trace (MCP's own server span, parented on ``meta`` already); otherwise
    the caller's span in ``meta`` becomes the parent.
    """
    current = get_current() if current is None else current
    # Only string values can be W3C header values; anything else in an open map is not a carrier.
    carrier = {key: value for key, value in (meta or {}).items() if isinstance(value, str)}
    try:
        incoming = propagate.extract(carrier)
    except (ValueError, TypeError):  # a propagator rejecting a malformed value: no context came
        incoming = Context()
    entries = dict(baggage.get_all(incoming))
    if CHAIN_BAGGAGE_KEY not in entries and BAGGAGE_KEY in carrier and not propagator_reads_baggage():
        # Configured propagators without baggage: read the chain member the client added alone.
        chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY, _W3C_BAGGAGE.extract(carrier))
        if chain is not None:
            entries[CHAIN_BAGGAGE_KEY] = chain
    ctx = baggage.remove_baggage(CHAIN_BAGGAGE_KEY, current)
    for key, value in entries.items():
        ctx = baggage.set_baggage(key, value, ctx)
    remote = trace.get_current_span(incoming).get_span_context()
    local = trace.get_current_span(current).get_span_context()
    if remote.is_valid and not (local.is_valid and local.trace_id == remote.trace_id):
        ctx = trace.set_span_in_context(NonRecordingSpan(remote), ctx)
    return ctx


def _carries_chain(header: object) -> bool:
    if not isinstance(header, str):
        return False
    return any(member.split("=", 1)[0].strip() == CHAIN_BAGGAGE_KEY for member in header.split(","))
