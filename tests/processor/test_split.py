"""Splitting an Export request to a byte limit: every item in exactly one part, each part within it.

Checked against protobuf's own decoding of the parts (opentelemetry-proto), for requests of every
signal that hypothesis builds, and for the shapes that force each cut.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from otel_guard_processor.split import split

Items = list[tuple[bytes, bytes, bytes]]  # (resource, scope, item) of every item, in order


def trace_request(shape: list[list[list[int]]]) -> ExportTraceServiceRequest:
    """Resources of scopes of spans, each span's name padded to the given size."""
    request = ExportTraceServiceRequest()
    for r, scopes in enumerate(shape):
        resource = ResourceSpans(
            resource=Resource(
                attributes=[KeyValue(key="service.name", value=AnyValue(string_value=f"r{r}"))]
            ),
            schema_url=f"https://r{r}",
        )
        for s, spans in enumerate(scopes):
            scope = ScopeSpans(scope=InstrumentationScope(name=f"r{r}s{s}"), schema_url=f"https://s{s}")
            for n, size in enumerate(spans):
                scope.spans.append(Span(span_id=bytes(8), name=f"r{r}s{s}n{n}".ljust(size, "x")))
            resource.scope_spans.append(scope)
        request.resource_spans.append(resource)
    return request


def trace_items(request: ExportTraceServiceRequest) -> Items:
    return [
        (resource.resource.SerializeToString() + resource.schema_url.encode(),
         scope.scope.SerializeToString() + scope.schema_url.encode(), span.SerializeToString())
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]  # fmt: skip


shapes = st.lists(st.lists(st.lists(st.integers(0, 400), max_size=6), max_size=4), max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, limit=st.integers(60, 3000))
def test_every_span_in_exactly_one_part_each_part_within_the_limit(
    shape: list[list[list[int]]], limit: int
) -> None:
    request = trace_request(shape)
    raw = request.SerializeToString()
    cut = split(raw, limit)
    assert all(len(part) <= limit for part in cut.parts)
    parts = [ExportTraceServiceRequest.FromString(part) for part in cut.parts]
    sent = [item for part in parts for item in trace_items(part)]
    too_large = [Span.FromString(item).SerializeToString() for item in cut.too_large]
    # Every span once, with its own resource and scope, in the order it came; the too large apart.
    assert [item for item in trace_items(request) if item[2] not in too_large] == sent
    assert sorted(too_large) == sorted(
        item[2] for item in trace_items(request) if item[2] not in {s[2] for s in sent}
    )
    if len(raw) <= limit:
        assert cut.parts == ([raw] if raw else [])
    for item in too_large:
        assert len(item) + 2 * 6 > limit - 60  # only what could not fit with its headers


def test_a_request_within_the_limit_is_one_part_of_the_same_bytes() -> None:
    raw = trace_request([[[10, 20]], [[30]]]).SerializeToString()
    assert split(raw, len(raw)).parts == [raw]


def test_resources_are_cut_between_before_scopes_and_scopes_before_spans() -> None:
    request = trace_request([[[100] * 3], [[100] * 3], [[100] * 3]])
    one = len(request.resource_spans[0].SerializeToString()) + 3
    cut = split(request.SerializeToString(), one + 10)  # one resource a part
    assert [len(ExportTraceServiceRequest.FromString(p).resource_spans) for p in cut.parts] == [1, 1, 1]
    cut = split(request.SerializeToString(), 400)  # two spans at most a part: each resource cut
    parts = [ExportTraceServiceRequest.FromString(p) for p in cut.parts]
    assert [len(p.resource_spans[0].scope_spans[0].spans) for p in parts] == [2, 1] * 3
    assert all(p.resource_spans[0].schema_url.startswith("https://r") for p in parts)
    assert not cut.too_large


def test_a_span_larger_than_the_limit_is_handed_back_alone() -> None:
    request = trace_request([[[50, 5000, 50]]])
    cut = split(request.SerializeToString(), 1000)
    assert [Span.FromString(item).name[:6] for item in cut.too_large] == ["r0s0n1"]
    spans = [
        s.name[:6]
        for p in cut.parts
        for s in ExportTraceServiceRequest.FromString(p).resource_spans[0].scope_spans[0].spans
    ]
    assert spans == ["r0s0n0", "r0s0n2"]


def test_logs_split_as_traces_do() -> None:
    request = ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                scope_logs=[
                    ScopeLogs(
                        log_records=[LogRecord(severity_text=f"{n}".ljust(300, "x")) for n in range(10)]
                    )
                ]
            )
        ]
    )
    cut = split(request.SerializeToString(), 1000)
    records = [
        record.severity_text[:1]
        for part in cut.parts
        for record in ExportLogsServiceRequest.FromString(part).resource_logs[0].scope_logs[0].log_records
    ]
    assert records == [str(n) for n in range(10)]
    assert len(cut.parts) == 4


def test_bytes_that_are_not_protobuf_are_a_value_error() -> None:
    raw = trace_request([[[1000]]]).SerializeToString()
    with pytest.raises(ValueError, match="not an OTLP request"):
        split(raw[:-5], 100)
