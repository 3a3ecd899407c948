"""A real OTLP/gRPC metrics receiver on 127.0.0.1 for the tests of ``--metrics-forward``: the
processor tests' :class:`Sink` (grpcio, every signal), with its metrics requests read back parsed."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from processor_helpers import Sink

Points = dict[tuple[tuple[str, str], ...], Any]


class MetricsSink(Sink):
    """A :class:`Sink` whose acknowledged metrics requests are ``requests``, in arrival order."""

    @property
    def requests(self) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
        return [
            metrics_service_pb2.ExportMetricsServiceRequest.FromString(raw) for raw in self.unread["metrics"]
        ]

    async def wait_for(self, count: int, timeout: float) -> None:
        """Return once ``count`` metrics requests arrived; fail after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while len(self.unread["metrics"]) < count:
                self.arrived.clear()
                await self.arrived.wait()


def value(any_value: AnyValue) -> Any:
    return getattr(any_value, any_value.WhichOneof("value") or "string_value")


def metrics_of(request: metrics_service_pb2.ExportMetricsServiceRequest) -> dict[str, Any]:
    """Metric name -> the Metric message, over every resource and scope of one request."""
    return {
        metric.name: metric
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }


def points(metric: Any) -> Points:
    """A metric's data points by their sorted attributes."""
    kind = metric.WhichOneof("data")
    return {
        tuple(sorted((kv.key, value(kv.value)) for kv in point.attributes)): point
        for point in getattr(metric, kind).data_points
    }


def number(point: Any) -> float:
    return float(point.as_int if point.WhichOneof("value") == "as_int" else point.as_double)
