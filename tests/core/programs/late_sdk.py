"""The first hop runs before the application installs its SDK; the hops after it must be recorded.

Prints the exported span names and the ``otel_guard.decisions`` points as JSON on stdout.
"""

from __future__ import annotations

import json

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_guard


def main() -> None:
    with otel_guard.delegate("early"):
        pass

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    with otel_guard.delegate("late"), otel_guard.delegate("later"):
        pass

    points = []
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    value = getattr(point, "value", getattr(point, "count", None))
                    points.append([metric.name, attributes.get("gen_ai.agent.name"), value])
    print(
        json.dumps(
            {"spans": [s.name for s in exporter.get_finished_spans()], "points": sorted(points, key=str)}
        )
    )


if __name__ == "__main__":
    main()
