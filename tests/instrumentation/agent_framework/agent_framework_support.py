"""What the Agent Framework tests share: the instrumentor for one test, and how to read the spans.

Agent Framework emits its own spans (``invoke_agent``, ``chat``, ``execute_tool``) to the same global
provider; the guard's are the ones carrying ``otel_guard.decision``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor
from tests.hop_spans import DECISION, decisions, guard_spans

__all__ = ["decisions", "framework_spans", "guard_spans", "instrumented_fixture", "parent_of"]


def instrumented_fixture() -> Any:
    """A fixture yielding the Agent Framework instrumentor instrumented for one test; a test module
    names it with one line (``instrumented = instrumented_fixture()``), as the other runtimes' do."""

    @pytest.fixture
    def instrumented() -> Iterator[AgentFrameworkInstrumentor]:
        instrumentor = AgentFrameworkInstrumentor()
        instrumentor.instrument()
        assert instrumentor.is_instrumented_by_opentelemetry, "the installed runtime failed the version check"
        yield instrumentor
        instrumentor.uninstrument()

    return instrumented


def framework_spans(spans: Any) -> list[ReadableSpan]:
    """Agent Framework's own spans (every span without the guard's attributes)."""
    return [s for s in spans.all() if not (s.attributes and DECISION in s.attributes)]


def parent_of(span: ReadableSpan, spans: Any) -> ReadableSpan | None:
    """The finished span that is ``span``'s parent, if any."""
    if span.parent is None:
        return None
    found = [s for s in spans.all() if s.context.span_id == span.parent.span_id]
    return found[0] if found else None
