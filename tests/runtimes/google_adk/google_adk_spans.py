"""What the Google ADK tests read from the recorded spans: the guard's hop spans and their decisions."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def guard_spans(spans: Any) -> list[ReadableSpan]:
    """The hop spans (those carrying the contract's attributes), in the order the hops started."""
    found = [s for s in spans.all() if s.attributes and "otel_guard.decision" in s.attributes]
    return sorted(found, key=lambda s: s.start_time or 0)


def decisions(spans: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    """(span name, decision, chain agents) of every hop, in the order the hops started."""
    found = []
    for span in guard_spans(spans):
        attributes = dict(span.attributes or {})
        agents = attributes["otel_guard.chain.agents"]
        assert isinstance(agents, tuple)
        found.append((span.name, str(attributes["otel_guard.decision"]), tuple(str(a) for a in agents)))
    return found


def parent_of(span: ReadableSpan, spans: Any) -> ReadableSpan:
    """The recorded span that is ``span``'s parent."""
    parents: list[ReadableSpan] = [
        s
        for s in spans.all()
        if span.parent is not None and s.context is not None and s.context.span_id == span.parent.span_id
    ]
    (parent,) = parents
    return parent
