"""What the Google ADK tests read from the recorded spans: the guard's hop spans (``tests.hop_spans``,
shared by every runtime's tests) and a span's parent."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from tests.hop_spans import decisions, guard_spans

__all__ = ["decisions", "guard_spans", "parent_of"]


def parent_of(span: ReadableSpan, spans: Any) -> ReadableSpan:
    """The recorded span that is ``span``'s parent."""
    parents: list[ReadableSpan] = [
        s
        for s in spans.all()
        if span.parent is not None and s.context is not None and s.context.span_id == span.parent.span_id
    ]
    (parent,) = parents
    return parent
