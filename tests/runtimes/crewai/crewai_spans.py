"""Reading the guard's hop spans out of the session's in-memory exporter (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

GUARD_ATTRIBUTE = "otel_guard.decision"


def guard_spans(spans: Any) -> list[ReadableSpan]:
    """Our hop spans (the ones carrying the contract's otel_guard.* attributes), in start order."""
    found = [s for s in spans.all() if s.attributes and GUARD_ATTRIBUTE in s.attributes]
    return sorted(found, key=lambda s: s.start_time or 0)


def decisions(spans: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    """(span name, decision, chain agents) of every hop span, in the order the hops started."""
    return [
        (s.name, str(s.attributes["otel_guard.decision"]), tuple(s.attributes["otel_guard.chain.agents"]))
        for s in guard_spans(spans)
        if s.attributes is not None
    ]


def refused(spans: Any) -> list[ReadableSpan]:
    return [s for s in guard_spans(spans) if s.attributes and s.attributes[GUARD_ATTRIBUTE] == "refuse"]
