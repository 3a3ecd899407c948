"""One fixture shape for every runtime's tests: the runtime's instrumentor, installed for one test.

Each test module names its fixture with one line, so a test still asks for the runtime it means::

    instrumented = instrumentor_fixture(A2AInstrumentor)

The fixture instruments on entry, checks the installed runtime passed the version check (otherwise
every hop test would fail for a reason far from its cause), and uninstruments afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

import pytest

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, resolve

InstrumentorT = TypeVar("InstrumentorT", bound=GuardInstrumentor)

# The runtimes whose tests run in an environment of their own (.venv-runtimes/<extra>,
# tests/instrumentation/<runtime>): their pins cannot share this one.
OWN_ENVIRONMENT = {
    "otel_guard_google_adk",
    "otel_guard_crewai",
    "otel_guard_strands",
    "otel_guard_smolagents",
    "otel_guard_agent_framework",
    "otel_guard_llama_index",
}


def our_entry_points(*, here_only: bool = True) -> list[EntryPoint]:
    """otel-guard's instrumentor entry points, by name; with ``here_only``, those whose runtime is
    tested in this environment."""
    ours = [
        ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.value.startswith("otel_guard.")
    ]
    if here_only:
        ours = [ep for ep in ours if ep.name not in OWN_ENVIRONMENT]
    return sorted(ours, key=lambda ep: ep.name)


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


def unresolved(targets: Iterable[PatchTarget]) -> list[str]:
    """Why each of ``targets`` (``(module, "Class.attribute")`` pairs) does not resolve to a callable in the
    installed runtime: empty when every patch target and internal name is where the instrumentor
    expects it."""
    missing = []
    for target in targets:
        try:
            found = resolve(target)
        except LookupError as exc:
            missing.append(str(exc))
            continue
        if not callable(found):
            missing.append(f"{target} is not callable")
    return missing
