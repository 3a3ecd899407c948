"""The OTLP/gRPC receiver: ``TraceService/Export``, and ``MetricsService/Export`` and
``LogsService/Export`` for the signals passed on unread (:mod:`otel_guard_processor.signals`).

The methods are registered with no deserializer, so a handler gets the request's bytes exactly as
they arrived -- the bytes the forwarder sends on. gRPC itself refuses a request larger than twice
``max_request_bytes`` (RESOURCE_EXHAUSTED); the handler refuses one larger than
``max_request_bytes`` with the same status and counts it. Requests compressed with gzip are
decompressed by gRPC.

A retryable error carries a ``google.rpc.Status`` with a ``RetryInfo`` detail in the
``grpc-status-details-bin`` trailer, which the OpenTelemetry Collector's exporters read.
"""

from __future__ import annotations

import time
from functools import partial

import grpc
import grpc.aio
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from otel_guard_processor.listeners import cannot_listen, check_bindable
from otel_guard_processor.pipeline import Answer, Pipeline
from otel_guard_processor.signals import UNREAD, Unread

__all__ = ["GrpcReceiver"]

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcReceiver:
    """A ``grpc.aio`` server with the Export method of each OTLP signal."""

    def __init__(self, pipeline: Pipeline, address: str, max_request_bytes: int) -> None:
        check_bindable("listen", address, "OTLP/gRPC")
        self._pipeline = pipeline
        self._max_request_bytes = max_request_bytes
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 2 * max_request_bytes),
                ("grpc.so_reuseport", 0),
            ]
        )
        handlers = [(SERVICE, partial(self._export, None))]
        handlers += [(signal.service, partial(self._export, signal)) for signal in UNREAD]
        self._server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(
                    service, {"Export": grpc.unary_unary_rpc_method_handler(export)}
                )
                for service, export in handlers
            )
        )
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise cannot_listen("listen", address, "OTLP/gRPC", exc) from None
        self.address = address

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish for up to ``grace`` seconds."""
        await self._server.stop(grace)

    async def _export(
        self, signal: Unread | None, raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        """One Export call: of traces (``signal`` None), or of metrics or logs."""
        started = time.perf_counter()
        if len(raw) > self._max_request_bytes:
            answer = self._pipeline.refuse(
                "grpc",
                "too_large",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request of {len(raw)} bytes is larger than max_request_bytes ({self._max_request_bytes})",
                len(raw),
                started,
            )
        elif signal is None:
            answer = await self._pipeline.export(raw, "grpc", started)
        else:
            answer = await self._pipeline.export_unread(signal, raw, "grpc", started)
        if answer.code == grpc.StatusCode.OK:
            return answer.response
        await context.abort(answer.code, answer.message, trailing_metadata=_details(answer))
        raise AssertionError("unreachable: abort raises")  # pragma: no cover


def _details(answer: Answer) -> tuple[tuple[str, bytes], ...]:
    if answer.retry_after is None:
        return ()
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(
            seconds=int(answer.retry_after), nanos=int(answer.retry_after % 1 * 1e9)
        )
    )
    status = status_pb2.Status(code=answer.code.value[0], message=answer.message)
    status.details.add().Pack(retry)
    return (("grpc-status-details-bin", status.SerializeToString()),)
