"""A request larger than the downstream takes is split to fit, each span forwarded once (docs/spec.md §9).

The downstream is a real grpcio server with the OpenTelemetry Collector's default limit,
``grpc.max_receive_message_length`` = 4 MiB, which refuses a larger message with gRPC's own
RESOURCE_EXHAUSTED ("Received message larger than max (N vs. 4194304)"). Before, the processor
answered that refusal as retryable and a 5 MiB request was retried for ever.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import httpx
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from processor_helpers import LOGS_SERVICE, ProcessorFactory, Sink, export, http_url
from processor_spans import Trace, encode

MIB = 1024 * 1024
LIMIT = 4 * MIB  # the Collector's OTLP receiver's default (grpc-go's), and this sink's


class LimitedSink(Sink):
    """The processor tests' sink with a gRPC receive limit, as a Collector has by default."""

    max_receive_bytes = LIMIT


@pytest.fixture
async def limited() -> AsyncIterator[LimitedSink]:
    downstream = LimitedSink()
    await downstream.start()
    yield downstream
    await downstream.stop()


def large_request(total: int, span_bytes: int = 2000, traces: int = 8) -> bytes:
    """About ``total`` bytes of spans of ``span_bytes`` each, in ``traces`` traces (one resource each)."""
    requests = []
    per_trace = total // span_bytes // traces + 1
    for _ in range(traces):
        trace = Trace()
        root = trace.agent("planner", attributes={"prompt": "x" * span_bytes})
        for n in range(per_trace - 1):
            trace.tool(f"lookup{n}", root, attributes={"result": "y" * span_bytes})
        requests.append(encode(*trace.spans))
    return b"".join(requests)


def span_ids(requests: list[bytes]) -> Counter[bytes]:
    return Counter(
        span.span_id
        for raw in requests
        for resource in ExportTraceServiceRequest.FromString(raw).resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    )


async def test_a_request_larger_than_the_downstream_takes_goes_as_parts_each_span_once(
    start_processor: ProcessorFactory, limited: LimitedSink
) -> None:
    # Three 5.7 MB requests at once on one connection: room for them in the gRPC receiver's share
    # of a connection (half of --max-pending-bytes; past it a client is told to retry).
    processor = await start_processor(forward=limited.address, max_pending_bytes=64 * MIB)
    raw = large_request(5 * MIB)
    assert len(raw) > LIMIT
    assert await export(processor, raw, timeout=10) == b""  # before: RESOURCE_EXHAUSTED, retry, for ever
    assert len(limited.received) >= 2
    assert all(len(part) <= LIMIT for part in limited.received)
    assert span_ids(limited.received) == span_ids([raw])  # every span, once
    assert processor.forwarder is not None
    assert processor.forwarder.limit == LIMIT
    # Learned: the next one is split before it is sent, and joined sends stay within the limit too.
    limited.received.clear()
    again = [large_request(5 * MIB) for _ in range(3)]
    await asyncio.gather(*(export(processor, raw, timeout=10) for raw in again))
    assert all(len(part) <= LIMIT for part in limited.received)
    assert span_ids(limited.received) == span_ids(again)


async def test_the_parts_partial_successes_are_summed_for_the_client(
    start_processor: ProcessorFactory, limited: LimitedSink
) -> None:
    limited.response = ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(rejected_spans=2, error_message="two too old")
    ).SerializeToString()
    processor = await start_processor(forward=limited.address, max_request_bytes=16 * MIB)
    response = ExportTraceServiceResponse.FromString(await export(processor, large_request(9 * MIB)))
    parts = len(limited.received)
    assert parts >= 3
    assert response.partial_success.rejected_spans == 2 * parts
    assert response.partial_success.error_message == "; ".join(["two too old"] * parts)


async def test_a_span_larger_than_the_limit_is_rejected_the_others_sent_once(
    start_processor: ProcessorFactory, limited: LimitedSink
) -> None:
    processor = await start_processor(forward=limited.address, max_request_bytes=16 * MIB)
    trace = Trace()
    root = trace.agent("planner")
    huge = trace.tool("lookup", root, attributes={"result": "z" * (5 * MIB)})
    small = [trace.tool(f"small{n}", root) for n in range(3)]
    raw = encode(root, huge, *small) + large_request(3 * MIB)
    response = ExportTraceServiceResponse.FromString(await export(processor, raw, timeout=10))
    assert response.partial_success.rejected_spans == 1
    assert (
        "1 spans larger than the 4194304 bytes the downstream takes" in response.partial_success.error_message
    )
    expected = span_ids([raw])
    del expected[huge.span_id]
    assert span_ids(limited.received) == expected


async def test_a_request_of_one_span_larger_than_the_limit_is_refused_without_a_retry(
    start_processor: ProcessorFactory, limited: LimitedSink
) -> None:
    processor = await start_processor(forward=limited.address)
    trace = Trace()
    trace.agent("planner", attributes={"prompt": "z" * (5 * MIB)})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await export(processor, encode(*trace.spans), timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "takes requests of at most 4194304 bytes" in (refused.value.details() or "")
    # No RetryInfo: the Collector's exporters drop it rather than retry it for ever.
    trailers = refused.value.trailing_metadata()
    assert isinstance(trailers, grpc.aio.Metadata)
    assert "grpc-status-details-bin" not in trailers
    # Over OTLP/HTTP: 413, which clients drop (a 429 they would send again for ever).
    async with httpx.AsyncClient() as client:
        answered = await client.post(
            http_url(processor),
            content=encode(*trace.spans),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=10,
        )
    assert answered.status_code == 413
    assert "Retry-After" not in answered.headers
    assert limited.received == []


async def test_logs_larger_than_the_downstream_takes_are_split_too(
    start_processor: ProcessorFactory, limited: LimitedSink
) -> None:
    processor = await start_processor(forward=limited.address)
    records = [LogRecord(severity_text=f"{n}:", body=None) for n in range(5000)]
    for record in records:
        record.severity_text += "x" * 1100
    raw = ExportLogsServiceRequest(
        resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])]
    ).SerializeToString()
    assert len(raw) > LIMIT
    assert processor.grpc is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{processor.grpc.port}") as channel:
        call = channel.unary_unary(
            f"/{LOGS_SERVICE}/Export", request_serializer=None, response_deserializer=None
        )
        assert await call(raw, timeout=10) == b""
    sent = [
        record.severity_text.split(":")[0]
        for part in limited.unread["logs"]
        for record in ExportLogsServiceRequest.FromString(part).resource_logs[0].scope_logs[0].log_records
    ]
    assert sent == [str(n) for n in range(5000)]
    assert all(len(part) <= LIMIT for part in limited.unread["logs"])


async def test_requests_whose_clients_left_leave_the_forwarders_queue_with_their_bytes(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    """The forwarder's queue is bounded in bytes by --max-pending-bytes: a client that gives up on a
    request waiting behind a slow downstream takes its bytes along. Before, the bytes stayed queued
    until a send took them, uncounted, while the pending-bytes count let more in: here 3.4 MiB
    beside 0.3 MiB counted, and with all four sends of a signal stuck, up to --max-inflight requests
    of --max-request-bytes (2 GiB by default)."""
    # A request forwarded holds twice its bytes (it, and the gRPC client's copy as it is sent), and a
    # request given up on is let go of when its reset reaches the event loop, maybe after the next.
    processor = await start_processor(forward=sink.address, max_pending_bytes=8 * MIB)
    forwarder = processor.forwarder
    assert forwarder is not None
    sink.delay = 3.0
    first = asyncio.ensure_future(export(processor, large_request(MIB // 4), timeout=10))
    await asyncio.wait_for(sink.arrived.wait(), 10)
    gave_up = 0
    for _ in range(24):  # 24 MiB, each given up on after 0.15 s
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await export(processor, large_request(MIB, traces=1), timeout=0.15)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        gave_up += 1
        # Every byte queued is one the pipeline counts against --max-pending-bytes.
        assert forwarder.queued_bytes <= processor.stats.pending_bytes
    await asyncio.sleep(0.2)
    assert gave_up == 24
    assert forwarder.queued_bytes == 0
    assert processor.stats.pending_bytes < MIB
    assert await first == b""
