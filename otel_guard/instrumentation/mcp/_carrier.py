"""The OpenTelemetry context in an MCP request's ``_meta``: written by the client, read by the server.

MCP requests carry an open ``_meta`` map, and the MCP specification (SEP-414) puts W3C trace context
there: ``traceparent``, ``tracestate`` and ``baggage`` keys, with the same values as the HTTP headers
of those names. The chain rides in the ``baggage`` key as the member ``otel_guard.chain``.

``_meta`` is the one carrier every transport shares -- stdio, streamable HTTP, and the in-process
pairings, where no HTTP header exists -- so the chain goes there even when the configured
propagators (``OTEL_PROPAGATORS``) leave baggage out: without it a loop through MCP would go unseen.

MCP's JSON-RPC dispatcher injects the current context into ``_meta`` itself, and MCP's server span
extracts it again: the guard injects only where no dispatcher does, and reuses what MCP's span
extracted from the same ``_meta`` (reading a chain token's baggage costs about what a span does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context, get_current, set_value
from opentelemetry.trace import NonRecordingSpan

from otel_guard._carriers import propagator_reads_baggage
from otel_guard._context_slots import BAGGAGE_SLOT, FAST_CONTEXT
from otel_guard.instrumentation.mcp._context import chain_value
from otel_guard.instrumentation.mcp._in_process import DISPATCHER_ATTRIBUTE
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

BAGGAGE_KEY: Final = "baggage"
"""The ``_meta`` key of the W3C baggage (the header's name, as SEP-414 uses it)."""

_W3C_BAGGAGE: Final = W3CBaggagePropagator()

try:  # where mcp 2.x keeps it; a version without it gets the context written here, as any other
    from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher as _JSONRPCDispatcher
except ImportError:  # pragma: no cover - depends on the installed mcp
    _JSONRPCDispatcher = None  # type: ignore[assignment,misc]


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
    return isinstance(getattr(session, DISPATCHER_ATTRIBUTE, None), _JSONRPCDispatcher)


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


def remembering_extraction(extract: Callable[[Any], Context | None]) -> Callable[[Any], Context | None]:
    """MCP's ``extract_trace_context(meta)`` (its server span's parent), keeping what it extracted
    from ``meta``, which :func:`context_from_meta` would otherwise extract again."""

    def extract_trace_context(meta: Any) -> Context | None:
        extracted = extract(meta)
        if extracted is not None and meta is not None:
            _extracted.set((meta, propagate.get_global_textmap(), extracted))
        return extracted

    return extract_trace_context


_extracted: ContextVar[tuple[object, object, Context] | None] = ContextVar(
    "otel_guard_mcp_extracted", default=None
)
"""The ``_meta`` MCP's server middleware last extracted in this context, the propagator it used and
the context it gave (the whole ``_meta`` is held, so no later one can be taken for it)."""


def _extract(meta: Mapping[str, Any], current: Context) -> Context:
    """The global propagator's extraction of ``meta``'s string values: the one MCP's
    middleware made of this very ``meta`` a moment ago, when it made one.

    Reading a W3C ``baggage`` header with a chain token costs about what a span does (the
    propagator's regular expressions over the token), so it is done once a request. MCP's read the
    whole ``meta``; the same values, and so the same answer, wherever every key the propagator reads
    (its ``fields``) holds a string or nothing.
    """
    seen = _extracted.get()
    if seen is not None and seen[0] is meta:
        textmap = propagate.get_global_textmap()
        extracted = seen[2]
        if (
            seen[1] is textmap
            and _reads_strings_only(meta, _fields_of(textmap))
            and not _chain_from(extracted, current)
        ):
            return extracted
    try:
        # From an empty context: a propagator given none starts from the current one (the W3C
        # baggage propagator does, when it comes first), whose chain is not the request's.
        return propagate.extract(_carrier_of(meta), context=Context())
    except (ValueError, TypeError):  # a propagator rejecting a malformed value: no context came
        return Context()


def _chain_from(extracted: Context, current: Context) -> bool:
    """Whether ``extracted`` holds the very chain of ``current``: a propagator that started from the
    current context (MCP's extraction passes none) kept it, and ``_meta`` may carry none."""
    chain = chain_value(extracted)  # baggage.get_baggage, read straight from the slot (every request)
    return chain is not None and chain is chain_value(current)


_fields: tuple[object, frozenset[str]] = (None, frozenset())  # the global propagator last asked, its fields


def _reads_strings_only(meta: Mapping[str, Any], fields: frozenset[str]) -> bool:
    """Whether every key of ``fields`` in ``meta`` holds a string (or is absent)."""
    for field in fields:
        value = meta.get(field)
        if value is not None and not isinstance(value, str):
            return False
    return True


def _fields_of(textmap: object) -> frozenset[str]:
    """The carrier keys ``textmap`` reads (its ``fields``), asked once per global propagator."""
    global _fields
    known, fields = _fields
    if known is not textmap:
        fields = frozenset(getattr(textmap, "fields", ()))
        _fields = (textmap, fields)
    return fields


def context_from_meta(meta: Mapping[str, Any] | None, current: Context | None = None) -> Context:
    """The context a server runs a request in: ``current`` with the baggage of ``meta``.

    ``meta`` is the only source of the chain: a chain left in ``current`` (a server task that
    inherited the context of an earlier request) is removed when ``meta`` carries none, so one
    request's chain never leaks into another's. The span in ``current`` stays the parent when it
    belongs to the caller's trace (MCP's own server span, parented on ``meta`` already); otherwise
    the caller's span in ``meta`` becomes the parent.
    """
    current = get_current() if current is None else current
    meta = meta or {}
    incoming = _extract(meta, current)
    entries = dict(baggage.get_all(incoming))
    if (
        CHAIN_BAGGAGE_KEY not in entries
        and isinstance(meta.get(BAGGAGE_KEY), str)
        and not propagator_reads_baggage()
    ):
        # Configured propagators without baggage: read the chain member the client added alone.
        chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY, _W3C_BAGGAGE.extract(_carrier_of(meta)))
        if chain is not None:
            entries[CHAIN_BAGGAGE_KEY] = chain
    ctx = _with_baggage(current, entries)
    remote = trace.get_current_span(incoming).get_span_context()
    local = trace.get_current_span(current).get_span_context()
    if remote.is_valid and not (local.is_valid and local.trace_id == remote.trace_id):
        ctx = trace.set_span_in_context(NonRecordingSpan(remote), ctx)
    return ctx


def _carrier_of(meta: Mapping[str, Any]) -> dict[str, str]:
    """The string values of ``meta``: only they can be W3C header values, anything else in an open
    map is not a carrier (made only when a propagator reads it: MCP's extraction is reused mostly)."""
    return {key: value for key, value in meta.items() if isinstance(value, str)}


def _with_baggage(current: Context, entries: Mapping[str, object]) -> Context:
    """``current`` with ``entries`` set in its baggage, made with one copy: an arriving chain replaces
    the one in force; with none arriving, the one in force goes (``remove_baggage`` then
    ``set_baggage`` for each entry, as the public API would, without a context for each step)."""
    if not FAST_CONTEXT:
        ctx = current if CHAIN_BAGGAGE_KEY in entries else baggage.remove_baggage(CHAIN_BAGGAGE_KEY, current)
        for key, value in entries.items():
            ctx = baggage.set_baggage(key, value, ctx)
        return ctx
    members = current.get(BAGGAGE_SLOT)
    merged: dict[str, object] = dict(members) if type(members) is dict else {}
    if CHAIN_BAGGAGE_KEY not in entries:
        merged.pop(CHAIN_BAGGAGE_KEY, None)
    merged.update(entries)
    return set_value(BAGGAGE_SLOT, merged, current)


def _carries_chain(header: object) -> bool:
    if not isinstance(header, str):
        return False
    return any(member.split("=", 1)[0].strip() == CHAIN_BAGGAGE_KEY for member in header.split(","))
