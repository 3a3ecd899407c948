"""A real OTLP/gRPC ``MetricsService`` on 127.0.0.1 for the tests of ``--metrics-forward``: grpcio
serving opentelemetry-proto's generated service, keeping every request it acknowledged."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

Points = dict[tuple[tuple[str, str], ...], Any]


class MetricsSink(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Keeps each ExportMetricsServiceRequest in ``requests``; ``arrived`` is set at each."""

    def __init__(self) -> None:
        self.requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.arrived = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        await self.start_on("127.0.0.1:0")

    async def start_on(self, address: str) -> None:
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(address)
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def Export(
        self, request: metrics_service_pb2.ExportMetricsServiceRequest, context: Any
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        self.requests.append(request)
        self.arrived.set()
        return metrics_service_pb2.ExportMetricsServiceResponse()

    async def wait_for(self, count: int, timeout: float) -> None:
        """Return once ``count`` requests arrived; fail after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < count:
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
