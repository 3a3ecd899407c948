"""Carriers: the caller's context read from request headers, and the chain kept out of replies and logs.

Shared by the ASGI middleware and the A2A and MCP adapters. What a reader would not guess: the
``baggage`` header is read even when ``OTEL_PROPAGATORS`` leaves baggage out (a loop through a server
would go unseen without it), and OpenTelemetry's baggage propagator would log an oversize header
whole, chain token and all, which :func:`keep_tokens_out_of_logs` stops for every extraction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from contextvars import Token
from typing import Final

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage import propagation as baggage_propagation
from opentelemetry.baggage.propagation import W3CBaggagePropagator

from otel_guard._context_slots import baggage_of
from otel_guard.chain import MAX_QUOTED
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

_BAGGAGE_ONLY = W3CBaggagePropagator()
_BAGGAGE_HEADER: Final = "baggage"
_log = logging.getLogger("otel_guard")

MAX_BAGGAGE_BYTES: Final = 8192
"""The most bytes the ``baggage`` headers of one request may hold, joined: the W3C Baggage limit,
which OpenTelemetry's propagator applies too (it drops a longer header whole, and the chain with it)."""


def carrier_from_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI raw headers as a propagator carrier: lower-case names, repeated headers joined by ``,``.

    Joining is how HTTP combines repeated fields (RFC 9110), and it is what the W3C baggage header
    expects when a proxy split one baggage header in two. Each name's values are joined once, at the
    end. ``baggage`` is read only up to :data:`MAX_BAGGAGE_BYTES`: past it the rest is not read, and
    the carrier has no ``baggage`` at all (one warning names the limit, never the header's text).
    """
    carrier: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    baggage_bytes = -1  # the joined baggage's length so far (no comma before the first)
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name == _BAGGAGE_HEADER:
            if baggage_bytes > MAX_BAGGAGE_BYTES:
                continue
            baggage_bytes += 1 + len(raw_value)
            if baggage_bytes > MAX_BAGGAGE_BYTES:
                continue
        value = raw_value.decode("latin-1")
        if name not in carrier:
            carrier[name] = value
        elif name in repeated:
            repeated[name].append(value)
        else:
            repeated[name] = [carrier[name], value]
    for name, values in repeated.items():
        carrier[name] = ",".join(values)
    if baggage_bytes > MAX_BAGGAGE_BYTES:
        carrier.pop(_BAGGAGE_HEADER, None)
        _log.warning(
            "otel-guard: a request's baggage headers hold more than %d bytes (the W3C limit): "
            "dropped, with any delegation chain in them",
            MAX_BAGGAGE_BYTES,
        )
    return carrier


_reads_baggage: tuple[object, bool] = (None, False)  # the global propagator last asked, its answer


def propagator_reads_baggage() -> bool:
    """Whether the global propagator reads the ``baggage`` header (``OTEL_PROPAGATORS`` has it)."""
    global _reads_baggage
    textmap = propagate.get_global_textmap()
    known, reads = _reads_baggage
    if known is not textmap:
        reads = _BAGGAGE_HEADER in textmap.fields
        _reads_baggage = (textmap, reads)
    return reads


def attach_caller_context(
    carrier: Mapping[str, str] | Callable[[], Mapping[str, str]],
) -> Token[otel_context.Context] | None:
    """Continue the caller's trace and chain from ``carrier``; return the token to detach, or ``None``.

    ``carrier`` may be a function that makes it (:func:`carrier_from_headers` of a request's headers):
    it is called only when the carrier is read, never when an OpenTelemetry server middleware outside
    has extracted the chain already (turning six headers into a carrier costs about 21 k instructions).

    When the current context has no span, the whole caller context is extracted by the global
    propagator (its span becomes the parent). When it has one (an OpenTelemetry server middleware or
    the runtime's own tracing started it), that span stays the parent and only the baggage is read,
    and not at all when the chain is already in the context. The ``baggage`` header is read even when
    ``OTEL_PROPAGATORS`` leaves baggage out: without it a loop through this server would go unseen.
    Either way it is read once.
    """
    current = otel_context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        # The chain read from the context's own slot (one lookup: otel_guard._in_force).
        members = baggage_of(current)
        if members and members.get(CHAIN_BAGGAGE_KEY) is not None:
            return None
        ctx = _BAGGAGE_ONLY.extract(carrier() if callable(carrier) else carrier, context=current)
    else:
        ctx = context_from_carrier(carrier() if callable(carrier) else carrier, current)
    return otel_context.attach(ctx)


def context_from_carrier(carrier: Mapping[str, str], base: otel_context.Context) -> otel_context.Context:
    """``base`` with what ``carrier`` holds, extracted by the global propagator, and the ``baggage``
    header read even when ``OTEL_PROPAGATORS`` leaves baggage out."""
    ctx = propagate.extract(carrier, context=base)
    if not propagator_reads_baggage():
        ctx = _BAGGAGE_ONLY.extract(carrier, context=ctx)
    return ctx


def baggage_without_chain(value: str) -> str:
    """A W3C ``baggage`` header value without its ``otel_guard.chain`` member (the others kept)."""
    members = [member for member in value.split(",") if member.split("=", 1)[0].strip() != CHAIN_BAGGAGE_KEY]
    return ",".join(members).strip()


def headers_without_chain(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """ASGI headers with the chain taken out of every ``baggage`` header (dropped if nothing is left).

    A reply never carries the chain: an app that injects its context into its response headers
    would otherwise hand the client a freshly signed token one hop longer than the one it sent.
    """
    kept = []
    for name, value in headers:
        if name.lower() != b"baggage":
            kept.append((name, value))
        elif rest := baggage_without_chain(value.decode("latin-1")):
            kept.append((name, rest.encode("latin-1")))
    return kept


class _BaggageNotLogged(logging.Filter):
    """Keeps the text of a baggage header out of what OpenTelemetry's W3C baggage propagator logs.

    The propagator logs a header it drops for its size (over 8,192 bytes) whole, and a list member it
    cannot read as it is: either may hold a chain token, which is never written to a log. Any text
    of over ``MAX_QUOTED`` characters in such a record is replaced by its length. The filter is on the
    propagator's own logger, so it covers every extraction in the process: the guard's (HTTP headers,
    gRPC metadata, MCP ``_meta``) and any other instrumentation's.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(arg, str) and len(arg) > MAX_QUOTED for arg in args):
            record.args = tuple(
                f"<{len(arg)} characters, not shown>"
                if isinstance(arg, str) and len(arg) > MAX_QUOTED
                else arg
                for arg in args
            )
        return True


def keep_tokens_out_of_logs() -> None:
    """Put :class:`_BaggageNotLogged` on the propagator's logger, once (a reload of this module, or
    of the guard, does not add a second)."""
    log = logging.getLogger(baggage_propagation.__name__)
    if not any(type(known).__name__ == _BaggageNotLogged.__name__ for known in log.filters):
        log.addFilter(_BaggageNotLogged())
