"""The two reads every guarded MCP call makes of the current context, made from one lookup of it.

A wrapper asks whether instrumentation is suppressed and which chain is in force on every call;
OpenTelemetry's own helpers look the current context up again for each key they read (two for
``is_instrumentation_enabled`` alone). Here the caller looks it up once and reads the keys from it:
the same keys, so the same answers.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import baggage
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context
from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY_PLAIN

from otel_guard._context_slots import BAGGAGE_SLOT, FAST_CONTEXT
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

_SUPPRESS_KEYS: Final = (_SUPPRESS_INSTRUMENTATION_KEY, _SUPPRESS_INSTRUMENTATION_KEY_PLAIN)


def suppressed(ctx: Context) -> bool:
    """Whether instrumentation is suppressed in ``ctx`` (``not is_instrumentation_enabled()`` there)."""
    return bool(ctx.get(_SUPPRESS_KEYS[0]) or ctx.get(_SUPPRESS_KEYS[1]))


def chain_value(ctx: Context) -> object:
    """The chain's baggage value in ``ctx`` (a token object or a string), or ``None``: read straight
    from the context's baggage slot (``_context_slots.baggage_of`` inline, as every call reads it
    three times; ``baggage.get_baggage`` costs four Python calls more)."""
    if FAST_CONTEXT:
        members = ctx.get(BAGGAGE_SLOT)
        return members.get(CHAIN_BAGGAGE_KEY) if type(members) is dict else None
    return baggage.get_baggage(CHAIN_BAGGAGE_KEY, ctx)
