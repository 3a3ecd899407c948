"""``instrument(tracer_provider=..., meter_provider=...)`` sends the guard's hops to those providers,
for every runtime's instrumentor, as OpenTelemetry instrumentors do."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from instrumentors import our_entry_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import delegate, telemetry

# The runtimes installed here; the others are tested in tests/instrumentation/<runtime>.
OURS = our_entry_points()


@pytest.fixture
def restore_global_telemetry() -> Iterator[None]:
    yield
    telemetry.bind()  # back to the global providers the rest of the suite reads


@pytest.mark.usefixtures("restore_global_telemetry")
@pytest.mark.parametrize("entry_point", OURS, ids=lambda ep: ep.name)
def test_hops_go_to_the_providers_given_to_instrument(entry_point: object, spans: object) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    instrumentor = entry_point.load()()  # type: ignore[attr-defined]
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    try:
        with delegate("planner", "plan"):
            pass
    finally:
        instrumentor.uninstrument()
    assert [span.name for span in exporter.get_finished_spans()] == ["invoke_agent planner"]
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert telemetry.METRIC_DECISIONS in names
    assert spans.all() == []  # type: ignore[attr-defined]  # nothing went to the global provider
