"""Where the OpenTelemetry context keeps the current span and the baggage, found once, and the
baggage read from there.

What a reader would not guess: the slots are found through the public API (an empty context changed
once, its one key read back) and a test holds the result to that API; with both known a hop reads
the baggage with one lookup and makes its context with one copy. This module imports nothing of the
guard's but the telemetry names, so the modules below the settings (the carriers) may use it.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import baggage, trace
from opentelemetry.context import Context

from otel_guard import telemetry as names

__all__ = ["BAGGAGE_SLOT", "FAST_CONTEXT", "SPAN_SLOT", "baggage_of"]

_BAGGAGE_KEY = names.CHAIN_BAGGAGE_KEY


def _context_slot(ctx: Context) -> str:
    """The one key ``ctx`` holds (an empty context changed once through the public API), or ``""``."""
    keys = list(ctx)
    return keys[0] if len(keys) == 1 else ""


# Where the context keeps the current span and the baggage, found once through the public API. With
# both known, a hop reads the baggage with one lookup and makes its context with one copy (instead
# of one copy for the span and one for the baggage); a test checks the result against the public API.
SPAN_SLOT = _context_slot(trace.set_span_in_context(trace.INVALID_SPAN, Context()))
BAGGAGE_PROBE = baggage.set_baggage(_BAGGAGE_KEY, "", Context())
BAGGAGE_SLOT = _context_slot(BAGGAGE_PROBE)
FAST_CONTEXT = bool(SPAN_SLOT and BAGGAGE_SLOT) and type(BAGGAGE_PROBE.get(BAGGAGE_SLOT)) is dict


def baggage_of(ctx: Context) -> Mapping[str, object] | None:
    """The baggage of ``ctx``, or ``None`` (or an empty mapping) when it has none."""
    if FAST_CONTEXT:
        value = ctx.get(BAGGAGE_SLOT)
        return value if type(value) is dict else None
    return baggage.get_all(ctx)
