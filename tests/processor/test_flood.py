"""A flood of new traces past max_traces: memory stays flat, evictions are counted, spans still go on."""

from __future__ import annotations

import asyncio
import os
import re

import grpc.aio
import httpx
import psutil
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from processor_helpers import EXPORT, Sink, processor_process, ready_port
from processor_spans import Trace, encode


def traffic(traces: int) -> tuple[bytes, list[bytes]]:
    """One request of ``traces`` agent traces, and its trace ids (to be replaced per request)."""
    spans = []
    ids = []
    for _ in range(traces):
        trace = Trace()
        planner = trace.agent("planner")
        budget = trace.agent("budget", trace.http_hop(planner))
        trace.tool("lookup", budget)
        trace.span("chat gpt-4o", planner, attributes={"gen_ai.operation.name": "chat"})
        spans.extend(reversed(trace.spans))
        ids.append(trace.trace_id)
    return encode(*spans), ids


def fresh(raw: bytes, ids: list[bytes]) -> bytes:
    for trace_id in ids:
        raw = raw.replace(b"\n\x10" + trace_id, b"\n\x10" + os.urandom(16))
    return raw


@pytest.mark.integration
@pytest.mark.slow
async def test_flood_past_max_traces_keeps_memory_flat(sink: Sink) -> None:
    args = ("--prometheus", "127.0.0.1:0", "--forward", sink.address)
    with processor_process(*args, "--max-traces", "2000", "--max-spans", "20000") as (process, ready):
        grpc_port, metrics_port = ready_port(ready, "OTLP/gRPC"), ready_port(ready, "metrics")
        raw, ids = traffic(60)  # 360 spans a request
        watched = psutil.Process(process.pid)
        rss: list[int] = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for _ in range(30):  # 30 x 8 requests x 60 traces: 14,400 traces, 7x max_traces
                await asyncio.gather(*(export(fresh(raw, ids), timeout=30) for _ in range(8)))
                rss.append(watched.memory_info().rss)
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics")).text

    def value(pattern: str) -> float:
        found = re.search(pattern + r" ([0-9.e+]+)", text)
        assert found, pattern
        return float(found.group(1))

    # Every request went on downstream (those that waited for a send, joined with others).
    assert (
        sum(len(ExportTraceServiceRequest.FromString(sent).resource_spans) for sent in sink.received) == 240
    )
    assert value(r'otel_guard_processor_spans_total\{outcome="forwarded"\}') == 240 * 360
    assert value(r'otel_guard_processor_trace_evictions_total\{reason="capacity"\}') >= 14_400 - 2_000
    assert value(r"otel_guard_processor_active_traces") <= 2_000
    assert value(r"otel_guard_processor_held_spans") <= 20_000
    assert value(r'otel_guard_delegations_total\{callee="budget",caller="planner"\}') == 14_400
    # Memory: once the bounds are reached (a third of the way), it stays where it is.
    settled, end = rss[10], rss[-1]
    assert end - settled < 16 * 2**20, [r // 2**20 for r in rss]
