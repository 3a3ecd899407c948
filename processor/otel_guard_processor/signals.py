"""The signals the processor takes and does not read: OTLP metrics and logs, passed on as they came.

An agent pointed at the processor with ``OTEL_EXPORTER_OTLP_ENDPOINT`` sends all three signals
there. Traces are read (:mod:`otel_guard_processor.otlp`); metrics and logs are forwarded byte for
byte with ``--forward``, or answered OK and let go without it, and counted either way. Over
protobuf they are never decoded: a view that declares only the request's top-level field, as
``bytes``, checks the framing of the request in upb, so a body that is not protobuf is answered
INVALID_ARGUMENT (400) and not sent on; what lies inside each resource is the downstream's to read.
OTLP/JSON is converted to protobuf in full, hex ids (a log record's, an exemplar's) included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_guard_processor.otlp import MalformedRequest, hex_ids_to_base64

__all__ = ["LOGS", "METRICS", "UNREAD", "Unread"]


@dataclass(frozen=True)
class Unread:
    """One signal the processor passes on unread."""

    name: str  # the ``signal`` label: metrics, logs
    service: str  # the gRPC service
    http_path: str
    request: type[Message]
    response: type[Message]

    @property
    def method(self) -> str:
        return f"/{self.service}/Export"

    def check(self, raw: bytes) -> None:
        """Raise MalformedRequest unless ``raw`` is framed as protobuf; nothing is decoded."""
        try:
            _Envelope.FromString(raw)
        except DecodeError as exc:
            raise MalformedRequest(f"not an OTLP {self.request.__name__}: {exc}") from None

    def json_to_protobuf(self, body: bytes) -> bytes:
        """The protobuf encoding of an OTLP/JSON request of this signal."""
        try:
            document = json.loads(body)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long
            raise MalformedRequest(f"not JSON this processor reads: {str(exc)[:200]}") from None
        except RecursionError:
            raise MalformedRequest("not JSON this processor reads: nested too deeply") from None
        if not isinstance(document, dict):
            raise MalformedRequest("an OTLP/JSON request must be a JSON object")
        for item, what in _items_with_ids(document, self.name):
            hex_ids_to_base64(item, what, _ID_SIZES)
        message = self.request()
        try:
            json_format.ParseDict(document, message, ignore_unknown_fields=True)
        except (json_format.ParseError, TypeError, ValueError, RecursionError) as exc:
            raise MalformedRequest(f"not an OTLP/JSON {self.request.__name__}: {str(exc)[:200]}") from None
        return message.SerializeToString()


METRICS = Unread(
    "metrics",
    "opentelemetry.proto.collector.metrics.v1.MetricsService",
    "/v1/metrics",
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
LOGS = Unread(
    "logs",
    "opentelemetry.proto.collector.logs.v1.LogsService",
    "/v1/logs",
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
UNREAD = (METRICS, LOGS)


def _envelope_class() -> Any:
    """``message Envelope { repeated bytes resources = 1; }``: field 1 is resource_metrics in an
    ExportMetricsServiceRequest and resource_logs in an ExportLogsServiceRequest; any other field
    is kept unknown, its framing checked."""
    name = "otel_guard_processor/otlp_envelope.proto"
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(name)
    except KeyError:
        field = descriptor_pb2.FieldDescriptorProto
        file = descriptor_pb2.FileDescriptorProto(
            name=name, package="otel_guard_processor.envelope", syntax="proto3"
        )
        envelope = file.message_type.add(name="Envelope")
        envelope.field.add(name="resources", number=1, type=field.TYPE_BYTES, label=field.LABEL_REPEATED)
        pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("otel_guard_processor.envelope.Envelope")
    )


_Envelope: Any = _envelope_class()

# Where OTLP/JSON holds ids, which it writes in hex (the protobuf JSON mapping would read base64).
_DATA_POINT_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "exponential_histogram")
_ID_SIZES = (("traceId", 16), ("spanId", 8))


def _items_with_ids(document: dict[str, Any], signal: str) -> Iterator[tuple[dict[str, Any], str]]:
    if signal == "logs":
        for scope in _nested(document, ("resourceLogs", "resource_logs"), ("scopeLogs", "scope_logs")):
            for record in _objects(scope, ("logRecords", "log_records")):
                yield record, "logRecord"
        return
    for scope in _nested(
        document, ("resourceMetrics", "resource_metrics"), ("scopeMetrics", "scope_metrics")
    ):
        for metric in _objects(scope, ("metrics",)):
            for kind in _DATA_POINT_KINDS:
                data = metric.get(kind)
                if data is None:
                    continue
                if not isinstance(data, dict):
                    raise MalformedRequest(f"metric.{kind} must be an object")
                for point in _objects(data, ("dataPoints", "data_points")):
                    for exemplar in _objects(point, ("exemplars",)):
                        yield exemplar, "exemplar"


def _nested(
    document: dict[str, Any], outer: tuple[str, ...], inner: tuple[str, ...]
) -> Iterator[dict[str, Any]]:
    for resource in _objects(document, outer):
        yield from _objects(resource, inner)


def _objects(parent: dict[str, Any], keys: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    for key in keys:
        value = parent.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise MalformedRequest(f"{key} must be a list of objects")
        yield from value
