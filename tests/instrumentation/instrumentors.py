"""What every runtime's instrumentor tests alike: the fixture that installs it for one test, and the
checks of the instrumentor itself (registered, patch targets resolve, patched when the app imports the
runtime and not before, hops sent to the providers given to ``instrument()``).

Each test module names its fixture with one line, so a test still asks for the runtime it means::

    instrumented = instrumentor_fixture(A2AInstrumentor)

The fixture instruments on entry, checks the installed runtime passed the version check (otherwise
every hop test would fail for a reason far from its cause), and uninstruments afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import telemetry
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
    "otel_guard_haystack",
    "otel_guard_claude_agent_sdk",
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


def assert_registered(
    make: type[GuardInstrumentor], entry_point_name: str, instruments: Iterable[str]
) -> None:
    """``make`` is the instrumentor behind otel-guard's entry point ``entry_point_name``, declares
    ``instruments`` as the runtime versions it supports, and finds the installed runtime in range."""
    (found,) = [ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == entry_point_name]
    assert found.load() is make
    assert tuple(make().instrumentation_dependencies()) == tuple(instruments)
    assert make()._check_dependency_conflicts() is None


class GivenProviders:
    """What reached the providers handed to ``instrument()`` (see :func:`given_providers`)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def hop_names(self) -> list[str]:
        """The names of the guard's hop spans these providers got, in the order they ended."""
        return [
            s.name
            for s in self.exporter.get_finished_spans()
            if s.attributes and "otel_guard.decision" in s.attributes
        ]

    def metric_names(self) -> set[str]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@contextmanager
def given_providers(make: Callable[[], GuardInstrumentor]) -> Iterator[GivenProviders]:
    """``make()`` instrumented with providers of its own for the block, then uninstrumented and the
    guard bound back to the global providers the rest of the suite reads."""
    given = GivenProviders()
    instrumentor = make()
    instrumentor.instrument(tracer_provider=given.tracer_provider, meter_provider=given.meter_provider)
    try:
        yield given
    finally:
        instrumentor.uninstrument()
        telemetry.bind()


_LAZY_PROGRAM = textwrap.dedent(
    """
    import importlib, json, sys, warnings
    import wrapt
    from importlib.metadata import entry_points
    from otel_guard.instrumentation._base import resolve

    wanted, prefixes, uninstrument_first = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "yes"
    app_import, after = sys.argv[4], sys.argv[5]
    # Every otel-guard instrumentor, as opentelemetry-instrument does; those whose runtime is not
    # installed here are skipped by their version check.
    ours = [ep.load() for ep in entry_points(group="opentelemetry_instrumentor")
            if ep.value.startswith("otel_guard.")]
    instrumentors = {cls.__name__: cls() for cls in ours}
    for instrumentor in instrumentors.values():
        instrumentor.instrument()
    def runtime(name):
        return any(name == p or name.startswith(p + ".") for p in prefixes)
    loaded_before = sorted(m for m in sys.modules if runtime(m))
    instrumentor = instrumentors[wanted]
    pending = instrumentor.is_instrumented_by_opentelemetry
    if uninstrument_first:
        instrumentor.uninstrument()
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(app_import, found)  # the app's first import of the runtime
    proxy = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
    module = sys.modules[type(instrumentor).__module__]
    def is_patched(found):  # a wrapt proxy, or a function standing for a method (LlamaIndex's)
        return isinstance(found, proxy) or hasattr(found, "_otel_guard_replaced")
    patched = [is_patched(resolve(t)) for t in module.PATCH_TARGETS]
    exec(after, found)
    report = {"loaded_before": loaded_before, "pending": pending, "patched": patched,
              "after": found.get("report")}
    print(json.dumps(report))
    """
)


def patched_on_import(
    make: type[GuardInstrumentor],
    app_import: str,
    runtime_modules: Iterable[str],
    *,
    uninstrument_first: bool,
    after: str = "",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """In a fresh interpreter: every otel-guard instrumentor instrumented, then ``make``'s uninstrumented
    if ``uninstrument_first``, then the app's ``app_import``. The report: ``loaded_before``, the
    modules under ``runtime_modules`` loaded before the app's import (none, if patching waits for it);
    ``pending``, whether ``make`` counted as instrumented before its runtime was imported;
    ``patched``, for each of its ``PATCH_TARGETS``, whether it is wrapped; ``after``, the ``report``
    that the code ``after`` (run last) sets, if any."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _LAZY_PROGRAM,
            make.__name__,
            json.dumps(list(runtime_modules)),
            "yes" if uninstrument_first else "no",
            app_import,
            after,
        ],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "does not exist" not in done.stderr, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
