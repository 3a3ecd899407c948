"""Shared fixtures: one in-memory SDK for the whole session, settings reset after every test.

OpenTelemetry lets a process set its global providers once, and proxies bind to the first one, so the
suite installs a single TracerProvider and MeterProvider at import time and clears them per test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_guard.budget
import otel_guard.settings

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader()
_TRACER_PROVIDER = TracerProvider()
_TRACER_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
trace.set_tracer_provider(_TRACER_PROVIDER)
metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


class SpanRecorder:
    """The spans finished during one test."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self._exporter = exporter

    def all(self) -> list[ReadableSpan]:
        return list(self._exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected one span {name!r}, got {[s.name for s in self.all()]}"
        return found[0]

    def clear(self) -> None:
        self._exporter.clear()


class MetricRecorder:
    """Reads the data points the in-memory reader has collected since the last read."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self._reader = reader

    def collect(self) -> MetricsData | None:
        return self._reader.get_metrics_data()

    def points(self, name: str) -> list[tuple[dict[str, object], object]]:
        """(attributes, point) for every data point of the metric ``name``."""
        data = self.collect()
        found: list[tuple[dict[str, object], object]] = []
        if data is None:
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found.append((dict(point.attributes or {}), point))
        return found


@pytest.fixture
def spans() -> Iterator[SpanRecorder]:
    _EXPORTER.clear()
    yield SpanRecorder(_EXPORTER)
    _EXPORTER.clear()


@pytest.fixture
def metric_reader() -> MetricRecorder:
    return MetricRecorder(_READER)


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """Every test starts from the environment's settings and leaves no configure() behind, and
    from empty budget stores (the memory store's counts are the process's)."""
    otel_guard.settings.reset_settings()
    otel_guard.budget.reset_stores()
    yield
    otel_guard.settings.reset_settings()
    otel_guard.budget.reset_stores()
