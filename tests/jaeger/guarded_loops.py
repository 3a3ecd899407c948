"""Loops as the inline guard records them (``otel_guard.delegate`` in enforce mode), as the OTLP export
requests an agent service sends; the processor process they go through, and its cycle exemplars.

The suite's one TracerProvider (tests/conftest.py) keeps the spans in memory; they are encoded as the
SDK's OTLP exporter encodes them, under the service name :data:`SERVICE`, which Jaeger files them by.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import grpc.aio
import httpx
import pytest
from fleet import Instance
from opentelemetry import baggage, context
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from processor_helpers import EXPORT
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from otel_guard import DelegationRefused, delegate

SERVICE = "travel-agents"
OPENMETRICS = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75"


class Processor(Instance):
    """``python -m otel_guard_processor`` forwarding to ``forward`` (Jaeger), each loop counted as it
    is seen (``--count-wait=0``). ``--metrics-grace=0``: on SIGTERM ``/metrics`` closes at once (by
    default it waits up to 15 s for a scrape after the drain, as a Prometheus would make; the test
    read its figures before); :attr:`status` is its exit status, 0 for a graceful stop."""

    def options(self) -> list[str]:
        return [
            f"--prometheus=127.0.0.1:{self.metrics_port}",
            "--count-wait=0",
            "--metrics-grace=0",
            "--drain-timeout=2",
        ]


def requests_of(recorded: list[ReadableSpan]) -> list[bytes]:
    """One export request per trace, in the order the traces began, from service :data:`SERVICE`."""
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in sorted(recorded, key=lambda span: span.start_time or 0):
        by_trace[span.context.trace_id].append(span)
    found = []
    for spans in by_trace.values():
        request = encode_spans(spans)
        for resource_spans in request.resource_spans:
            for kv in resource_spans.resource.attributes:
                if kv.key == "service.name":
                    kv.value.string_value = SERVICE
        found.append(request.SerializeToString())
    return found


def loop_in_one_trace(spans: Any) -> list[bytes]:
    """planner → budget → planner, the return refused (``cycle``): one trace."""
    spans.clear()
    with delegate("planner"), delegate("budget"), pytest.raises(DelegationRefused), delegate("planner"):
        pass
    recorded = spans.all()
    assert len(recorded) == 3
    return requests_of(recorded)


def loop_over_three_traces(spans: Any) -> list[bytes]:
    """One delegation tree over three traces, as through a queue that keeps the baggage but not the
    trace: planner → budget (trace 1, with a model call under budget), budget → writer (trace 2),
    budget → planner, refused as a loop (trace 3: that span alone)."""
    spans.clear()
    model = trace_api.get_tracer("tests.model-calls")
    with delegate("planner"), delegate("budget"):
        with model.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
            pass
        chain = baggage.get_all()
    for then in ("writer", "planner"):
        fresh = context.Context()
        for key, value in chain.items():
            fresh = baggage.set_baggage(key, value, fresh)
        token = context.attach(fresh)
        try:
            if then == "writer":
                with delegate("writer"):
                    pass
            else:
                with pytest.raises(DelegationRefused), delegate("planner"):
                    pass
        finally:
            context.detach(token)
    recorded = spans.all()
    assert len({span.context.trace_id for span in recorded}) == 3
    return requests_of(recorded)


def no_loop(spans: Any) -> list[bytes]:
    """planner → writer: a tree of its own, no loop."""
    spans.clear()
    with delegate("planner"), delegate("writer"):
        pass
    return requests_of(spans.all())


def spans_of(raw: bytes) -> list[Any]:
    request = ExportTraceServiceRequest.FromString(raw)
    return [
        span
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


def chain_root(raw: bytes) -> str:
    """The chain root the request's guard spans name (one for all of them)."""
    (root,) = {
        kv.value.string_value
        for span in spans_of(raw)
        for kv in span.attributes
        if kv.key == "otel_guard.chain.root"
    }
    return str(root)


async def send(address: str, requests: list[bytes]) -> None:
    """Export the requests, one after the other, to the OTLP/gRPC receiver at ``address``."""
    async with grpc.aio.insecure_channel(address) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for raw in requests:
            await export(raw, timeout=10)


async def cycle_exemplars(metrics_port: int) -> dict[tuple[tuple[str, str], ...], dict[str, str] | None]:
    """``otel_guard_cycles_total`` series (their labels) → their exemplar's labels, as a Prometheus
    that asks for OpenMetrics scrapes them from the processor's ``/metrics``."""
    async with httpx.AsyncClient() as client:
        response = await client.get(
            f"http://127.0.0.1:{metrics_port}/metrics", headers={"Accept": OPENMETRICS}, timeout=5
        )
    response.raise_for_status()
    found: dict[tuple[tuple[str, str], ...], dict[str, str] | None] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "otel_guard_cycles_total":
                exemplar = sample.exemplar
                found[tuple(sorted(sample.labels.items()))] = dict(exemplar.labels) if exemplar else None
    return found
