"""What the Strands tests share: the instrumentor for one test, and how to read the guard's spans.

Strands emits its own spans (``invoke_agent``, ``execute_event_loop_cycle``, ``chat``,
``execute_tool``) to the same global provider; the guard's are the ones carrying
``otel_guard.decision``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from otel_guard.instrumentation.strands import StrandsInstrumentor
from tests.hop_spans import DECISION, decisions, guard_spans

__all__ = ["decisions", "guard_spans", "instrumented_fixture", "parent_of", "strands_spans"]


def instrumented_fixture() -> Any:
    """A fixture yielding the Strands instrumentor instrumented for one test; a test module names it
    with one line (``instrumented = instrumented_fixture()``), as the other runtimes' tests do."""

    @pytest.fixture
    def instrumented() -> Iterator[StrandsInstrumentor]:
        instrumentor = StrandsInstrumentor()
        instrumentor.instrument()
        assert instrumentor.is_instrumented_by_opentelemetry, "the installed Strands failed the version check"
        yield instrumentor
        instrumentor.uninstrument()

    return instrumented


def strands_spans(spans: Any) -> list[ReadableSpan]:
    """Strands' own spans (every span without the guard's attributes)."""
    return [s for s in spans.all() if not (s.attributes and DECISION in s.attributes)]


def parent_of(span: ReadableSpan, spans: Any) -> ReadableSpan | None:
    """The finished span that is ``span``'s parent, if any."""
    if span.parent is None:
        return None
    found = [s for s in spans.all() if s.context.span_id == span.parent.span_id]
    return found[0] if found else None
