"""One fixture shape for every runtime's tests: the runtime's instrumentor, installed for one test.

Each test module names its fixture with one line, so a test still asks for the runtime it means::

    instrumented = instrumentor_fixture(A2AInstrumentor)

The fixture instruments on entry, checks the installed runtime passed the version check (otherwise
every hop test would fail for a reason far from its cause), and uninstruments afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from otel_guard.instrumentation._base import GuardInstrumentor

InstrumentorT = TypeVar("InstrumentorT", bound=GuardInstrumentor)


def instrumentor_fixture(make: Callable[[], InstrumentorT]) -> Any:
    """A pytest fixture yielding ``make()`` instrumented; the module attribute names the fixture."""

    @pytest.fixture
    def instrumentor() -> Iterator[InstrumentorT]:
        instrumentor = make()
        instrumentor.instrument()
        assert instrumentor.is_instrumented_by_opentelemetry, "the installed runtime failed the version check"
        yield instrumentor
        instrumentor.uninstrument()

    return instrumentor
