"""The smolagents instrumentor itself: its patch targets exist in the installed smolagents, its
metadata is in step with the distribution's, it patches smolagents only when the app imports it, and
the providers given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from smolagents_loop import Ask, CallBudget, ScriptedModel, agent

from otel_guard import telemetry
from otel_guard.instrumentation.smolagents import PATCH_TARGETS, SmolagentsInstrumentor
from otel_guard.instrumentation.smolagents.package import _instruments
from tests.hop_spans import guard_spans
from tests.instrumentation.instrumentors import unresolved


def test_every_patch_target_exists_in_the_installed_smolagents() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_smolagents() -> None:
    (entry_point,) = [
        ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == "otel_guard_smolagents"
    ]
    assert entry_point.load() is SmolagentsInstrumentor
    assert tuple(SmolagentsInstrumentor().instrumentation_dependencies()) == _instruments
    assert SmolagentsInstrumentor()._check_dependency_conflicts() is None


# -- lazy patching ------------------------------------------------------------------------------

PROGRAM = textwrap.dedent(
    """
    import json, sys
    import wrapt
    from otel_guard.instrumentation._base import resolve
    from otel_guard.instrumentation.smolagents import PATCH_TARGETS, SmolagentsInstrumentor

    uninstrument_first = sys.argv[1] == "yes"
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument()
    loaded_before = sorted(m for m in sys.modules if m == "smolagents" or m.startswith("smolagents."))
    pending = instrumentor.is_instrumented_by_opentelemetry
    if uninstrument_first:
        instrumentor.uninstrument()
    import smolagents  # the app's import
    proxy = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
    patched = [isinstance(resolve(target), proxy) for target in PATCH_TARGETS]
    print(json.dumps({"loaded_before": loaded_before, "pending": pending, "patched": patched}))
    """
)


def run_lazily(uninstrument_first: bool) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, "yes" if uninstrument_first else "no"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.integration
def test_smolagents_is_patched_when_the_app_imports_it() -> None:
    report = run_lazily(uninstrument_first=False)
    assert report["loaded_before"] == [], "instrument() imported smolagents before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_smolagents_unpatched() -> None:
    report = run_lazily(uninstrument_first=True)
    assert report["patched"] == [False] * len(PATCH_TARGETS)


# -- providers ----------------------------------------------------------------------------------


@pytest.fixture
def restore_global_telemetry() -> Iterator[None]:
    yield
    telemetry.bind()  # back to the global providers the rest of the suite reads


@pytest.mark.usefixtures("restore_global_telemetry")
def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    try:
        lookup = Ask("lookup", "Look something up.", lambda question: "found")
        model = ScriptedModel("searcher", "lookup", CallBudget(1))
        agent("searcher", model, [lookup]).run("find")
    finally:
        instrumentor.uninstrument()

    assert [span.name for span in exporter.get_finished_spans()] == [
        "execute_tool lookup",
        "invoke_agent searcher",
    ]
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert telemetry.METRIC_DECISIONS in names
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider
