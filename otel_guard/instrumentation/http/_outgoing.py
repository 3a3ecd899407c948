"""The chain on an outgoing HTTP request: the ``otel_guard.chain`` member of its ``baggage`` header.

OpenTelemetry's client instrumentations inject the whole context (``traceparent``, ``baggage``) when
they are installed and ``OTEL_PROPAGATORS`` names baggage. What a reader would not guess: the guard
adds its own member whatever they do, because a chain that does not leave the process leaves every
loop through another service unseen; a header that already carries the member is left as it is,
and one an instrumentation writes later simply replaces it with the same member.
"""

from __future__ import annotations

from opentelemetry import context

from otel_guard._context_slots import baggage_of
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

_MEMBER_PREFIX = f"{CHAIN_BAGGAGE_KEY}="


def chain_member() -> str | None:
    """The baggage member (``otel_guard.chain=<token>``) of the chain in force, or ``None``."""
    members = baggage_of(context.get_current())
    value = members.get(CHAIN_BAGGAGE_KEY) if members else None
    # A token made here signs itself when turned to text; one that arrived is its text already.
    return None if value is None else _MEMBER_PREFIX + str(value)


def with_member(header: str | None, member: str) -> str | None:
    """The ``baggage`` header ``header`` with ``member`` added, or ``None`` when it has the chain."""
    if not header:
        return member
    for existing in header.split(","):
        if existing.strip().startswith(_MEMBER_PREFIX):
            return None
    return f"{header},{member}"
