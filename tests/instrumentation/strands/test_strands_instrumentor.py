"""The Strands instrumentor itself: its patch targets exist in the installed Strands, its metadata is
in step with the distribution's, it patches Strands only when the app imports it, and the providers
given to ``instrument()`` get the hops of a real run."""

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
from strands import Agent, tool
from strands_loop import CallBudget, ScriptedModel
from strands_support import guard_spans

from otel_guard import telemetry
from otel_guard.instrumentation.strands import PATCH_TARGETS, StrandsInstrumentor
from otel_guard.instrumentation.strands._tool_stream import INTERNAL_NAMES
from otel_guard.instrumentation.strands.package import _instruments
from tests.instrumentation.instrumentors import unresolved


def test_every_patch_target_and_internal_name_exists_in_the_installed_strands() -> None:
    missing = unresolved((*PATCH_TARGETS, *INTERNAL_NAMES))
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_strands() -> None:
    (entry_point,) = [
        ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == "otel_guard_strands"
    ]
    assert entry_point.load() is StrandsInstrumentor
    assert tuple(StrandsInstrumentor().instrumentation_dependencies()) == _instruments
    assert StrandsInstrumentor()._check_dependency_conflicts() is None


# -- lazy patching ------------------------------------------------------------------------------

PROGRAM = textwrap.dedent(
    """
    import json, sys
    import wrapt
    from otel_guard.instrumentation._base import resolve
    from otel_guard.instrumentation.strands import PATCH_TARGETS, StrandsInstrumentor

    uninstrument_first = sys.argv[1] == "yes"
    instrumentor = StrandsInstrumentor()
    instrumentor.instrument()
    loaded_before = sorted(m for m in sys.modules if m == "strands" or m.startswith("strands."))
    pending = instrumentor.is_instrumented_by_opentelemetry
    if uninstrument_first:
        instrumentor.uninstrument()
    import strands  # the app's import
    multiagent = "strands.multiagent" in sys.modules
    proxy = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
    patched = [isinstance(resolve(target), proxy) for target in PATCH_TARGETS]  # imports the swarm
    print(json.dumps({"loaded_before": loaded_before, "pending": pending, "multiagent": multiagent,
                      "patched": patched}))
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
    assert "does not exist" not in done.stderr, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.integration
def test_strands_is_patched_when_the_app_imports_it() -> None:
    report = run_lazily(uninstrument_first=False)
    assert report["loaded_before"] == [], "instrument() imported Strands before the app did"
    assert report["pending"] is True
    # The swarm module is patched when the app imports it, not with strands itself.
    assert report["multiagent"] is False
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_strands_unpatched() -> None:
    report = run_lazily(uninstrument_first=True)
    assert report["patched"] == [False] * len(PATCH_TARGETS)


# -- providers ----------------------------------------------------------------------------------


@pytest.fixture
def restore_global_telemetry() -> Iterator[None]:
    yield
    telemetry.bind()  # back to the global providers the rest of the suite reads


@pytest.mark.usefixtures("restore_global_telemetry")
async def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    instrumentor = StrandsInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    try:

        @tool
        def lookup(question: str) -> str:
            """Look something up."""
            return question

        model = ScriptedModel("searcher", "lookup", CallBudget(1))
        agent = Agent(name="searcher", model=model, tools=[lookup], callback_handler=None)
        await agent.invoke_async("find")
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
    # Nothing of the guard's went to the global provider (Strands' own spans did).
    assert guard_spans(spans) == []
    assert spans.all()
