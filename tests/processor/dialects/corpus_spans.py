"""Recorded spans (JSON lines, the format of ``corpus/README.md``) as OTLP requests for the detector."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from processor_spans import any_value

CORPUS = Path(__file__).parent / "corpus"


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def to_span(record: dict[str, Any]) -> Span:
    """One recorded span as an OTLP span (ended when recorded, else 50 ms after it started)."""
    span = Span(
        trace_id=bytes.fromhex(record["trace_id"]),
        span_id=bytes.fromhex(record["span_id"]),
        parent_span_id=bytes.fromhex(record["parent_id"]) if record["parent_id"] else b"",
        name=record["name"],
        kind=getattr(Span, f"SPAN_KIND_{record['kind']}"),
        start_time_unix_nano=record["start"],
        end_time_unix_nano=record.get("end") or record["start"] + 50_000_000,
    )
    for key, value in record["attributes"].items():
        span.attributes.append(KeyValue(key=key, value=any_value(value)))
    return span


def to_request(records: Iterable[dict[str, Any]]) -> ExportTraceServiceRequest:
    """One request, a ScopeSpans per instrumentation scope, the spans in the order recorded."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    scopes: dict[str, Any] = {}
    for record in records:
        scope_spans = scopes.get(record["scope"])
        if scope_spans is None:
            scope_spans = scopes[record["scope"]] = resource_spans.scope_spans.add()
            scope_spans.scope.name = record["scope"]
            scope_spans.scope.version = record.get("scope_version") or ""
        scope_spans.spans.append(to_span(record))
    return request
