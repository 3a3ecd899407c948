"""Requests that arrive while a send is in flight go downstream as one, and lose nothing by it."""

from __future__ import annotations

import asyncio
from itertools import permutations

import grpc
import grpc.aio
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from otel_guard_processor.forwarder import MERGE_BYTES
from processor_helpers import ProcessorFactory, Sink, export, scrape, series
from processor_spans import Trace, encode

SPANS = "otel_guard_processor_spans_total"


def a_trace(agent: str = "planner", payload: int = 0) -> bytes:
    trace = Trace()
    planner = trace.agent(agent, attributes={"prompt": "x" * payload} if payload else None)
    trace.tool("lookup", planner)
    return encode(*trace.spans)


def spans_of(requests: list[bytes]) -> list[bytes]:
    """Every span of ``requests`` (its name and id), sorted: the same whichever sends carried them."""
    return sorted(
        span.name.encode() + span.span_id
        for raw in requests
        for resource in ExportTraceServiceRequest.FromString(raw).resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    )


async def first_in_flight(processor: object, sink: Sink, raw: bytes) -> asyncio.Future[bytes]:
    """Send ``raw`` and return once the downstream holds it (its ``delay`` keeps it there)."""
    call = asyncio.ensure_future(export(processor, raw))  # type: ignore[arg-type]
    await asyncio.wait_for(sink.arrived.wait(), 10)
    return call


async def test_requests_waiting_for_a_send_go_as_one_in_their_bytes(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sink.delay = 0.4
    first = await first_in_flight(processor, sink, a_trace())
    waiting = [a_trace(name) for name in ("budget", "search", "writer")]
    calls = [asyncio.ensure_future(export(processor, raw)) for raw in waiting]
    await asyncio.sleep(0.1)
    assert not any(call.done() for call in calls)  # acknowledged only once the downstream did
    assert await first == b""
    assert await asyncio.gather(*calls) == [b"", b"", b""]
    assert len(sink.received) == 2
    # One send of the three requests' bytes, joined in the order they arrived.
    assert sink.received[1] in {b"".join(order) for order in permutations(waiting)}
    assert len(ExportTraceServiceRequest.FromString(sink.received[1]).resource_spans) == 3
    spans = series(await scrape(processor), SPANS)
    assert spans == {("received",): 8, ("forwarded",): 8}


async def test_an_idle_processor_sends_each_request_alone(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sent = [a_trace() for _ in range(4)]
    for raw in sent:
        await export(processor, raw)
    assert sink.received == sent


async def test_a_permanent_error_of_a_joined_send_is_each_requests_own(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sink.delay = 0.3
    sink.refuse_if = lambda raw: b"unreadable" in raw
    first = await first_in_flight(processor, sink, a_trace())
    good, bad, other = a_trace("budget"), a_trace("unreadable"), a_trace("writer")
    calls = [asyncio.ensure_future(export(processor, raw)) for raw in (good, bad, other)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert await first == b""
    assert results[0] == b""
    assert results[2] == b""
    assert isinstance(results[1], grpc.aio.AioRpcError)
    assert results[1].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot read one of these" in (results[1].details() or "")
    # The joined send was refused whole; sent again one by one, the others got through, once.
    assert sorted(sink.received[1:]) == sorted([good, other])
    spans = series(await scrape(processor), SPANS)
    assert spans == {("received",): 8, ("forwarded",): 6, ("rejected",): 2}


async def test_a_retryable_error_of_a_joined_send_is_told_to_every_client(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address, retry_after=0.5)
    sink.delay = 0.3
    first = await first_in_flight(processor, sink, a_trace())
    sink.fail_with = grpc.StatusCode.UNAVAILABLE
    waiting = [a_trace("budget"), a_trace("writer")]
    results = await asyncio.gather(*(export(processor, raw) for raw in waiting), return_exceptions=True)
    codes = [error.code() for error in results if isinstance(error, grpc.aio.AioRpcError)]
    assert codes == [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
    with pytest.raises(grpc.aio.AioRpcError):
        await first
    sink.fail_with = None
    for raw in waiting:  # the clients kept them and send them again
        assert await export(processor, raw) == b""
    assert sink.received == waiting


async def test_a_partial_success_of_a_joined_send_says_it_was_for_several(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    partial = ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(rejected_spans=1, error_message="one span too old")
    )
    sink.response = partial.SerializeToString()
    sink.delay = 0.3
    first = await first_in_flight(processor, sink, a_trace())
    answers = await asyncio.gather(export(processor, a_trace("budget")), export(processor, a_trace("writer")))
    assert await first == sink.response  # sent alone: the downstream's answer as it wrote it
    for answer in answers:
        shared = ExportTraceServiceResponse.FromString(answer).partial_success
        assert shared.rejected_spans == 1
        assert shared.error_message == (
            "the downstream's answer to 2 requests sent to it as one, this one among them: one span too old"
        )


async def test_a_joined_send_stays_within_merge_bytes(start_processor: ProcessorFactory, sink: Sink) -> None:
    processor = await start_processor(forward=sink.address, max_pending_bytes=64 * 1024 * 1024)
    sink.delay = 0.3
    first = await first_in_flight(processor, sink, a_trace())
    third = MERGE_BYTES // 3 + 1  # two fit in one send, three do not
    waiting = [a_trace(f"agent{index}", payload=third) for index in range(5)]
    larger = a_trace("large", payload=MERGE_BYTES + 1)
    answers = await asyncio.gather(*(export(processor, raw, timeout=30) for raw in [*waiting, larger]))
    await first
    assert answers == [b""] * 6
    sends = sink.received[1:]
    assert larger in sends  # larger than a send may be: it goes alone, as it came
    assert all(len(raw) <= MERGE_BYTES for raw in sends if raw != larger)
    assert spans_of(sends) == spans_of([*waiting, larger])  # each span sent once


async def test_a_waiting_request_whose_client_gave_up_is_not_sent(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sink.delay = 1.0
    first = await first_in_flight(processor, sink, a_trace())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, a_trace("budget"), timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await first
    await asyncio.sleep(0.2)
    assert len(sink.received) == 1  # the client sends it again itself: not sent twice
    assert processor.forwarder is not None
    assert processor.forwarder.inflight == 0
