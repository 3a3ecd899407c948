"""Forwarding: the same bytes downstream, acknowledged only after the downstream, retryable errors."""

from __future__ import annotations

import asyncio
import gc
import json
import types

import grpc
import grpc.aio
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from processor_helpers import ProcessorFactory, Sink, export, http_url, scrape, series
from processor_spans import Trace, encode, request

SPANS = "otel_guard_processor_spans_total"
ERRORS = "otel_guard_processor_downstream_errors_total"


def loop_trace() -> Trace:
    trace = Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", trace.http_hop(planner))
    trace.agent("planner", budget)
    return trace


def retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    """The RetryInfo delay in the error's google.rpc.Status trailer, if it has one."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


async def test_requests_reach_the_downstream_byte_for_byte(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sent = [encode(*loop_trace().spans) for _ in range(5)]
    for raw in sent:
        assert await export(processor, raw) == b""
    assert sink.received == sent
    async with httpx.AsyncClient() as client:
        body = encode(*loop_trace().spans)
        response = await client.post(
            http_url(processor), content=body, headers={"Content-Type": "application/x-protobuf"}
        )
    assert response.status_code == 200
    assert sink.received[-1] == body
    samples = await scrape(processor)
    assert series(samples, SPANS) == {("received",): 30, ("forwarded",): 30}
    assert processor.detector.cycles == {("cross_function", "planner>budget>planner"): 6}


async def test_json_is_forwarded_as_its_protobuf_encoding(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    from test_receivers import otlp_json

    processor = await start_processor(forward=sink.address)
    message = request(*loop_trace().spans)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor), content=otlp_json(message), headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 200
    assert ExportTraceServiceRequest.FromString(sink.received[0]) == message


async def test_acknowledged_only_after_the_downstream(start_processor: ProcessorFactory, sink: Sink) -> None:
    processor = await start_processor(forward=sink.address)
    sink.delay = 0.5
    call = asyncio.ensure_future(export(processor, encode(*loop_trace().spans)))
    await asyncio.wait_for(sink.arrived.wait(), 10)
    await asyncio.sleep(0.2)
    assert not call.done()  # the downstream has it but has not answered: the client waits
    assert sink.received == []
    await call
    assert len(sink.received) == 1


async def test_downstream_response_reaches_the_client_unchanged(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    partial = ExportTraceServiceResponse(
        partial_success=ExportTracePartialSuccess(rejected_spans=2, error_message="two spans too old")
    )
    sink.response = partial.SerializeToString()
    assert await export(processor, encode(*loop_trace().spans)) == sink.response
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=encode(*loop_trace().spans),
            headers={"Content-Type": "application/x-protobuf"},
        )
    assert ExportTraceServiceResponse.FromString(response.content) == partial


async def test_downstream_down_then_back_nothing_missing(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    port = sink.port
    processor = await start_processor(forward=sink.address, retry_after=2.0)
    delivered_before = encode(*loop_trace().spans)
    await export(processor, delivered_before)
    await sink.stop()

    refused = encode(*loop_trace().spans)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, refused)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert retry_delay(caught.value) == 2.0
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor), content=refused, headers={"Content-Type": "application/x-protobuf"}
        )
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "2"

    back = Sink()
    await back.start(port)
    try:
        # The client retries, as the Collector's exporter would, until the downstream takes it.
        codes: list[grpc.StatusCode] = []
        deadline = asyncio.get_running_loop().time() + 20
        while asyncio.get_running_loop().time() < deadline:
            try:
                await export(processor, refused, timeout=2)
                break
            except grpc.aio.AioRpcError as error:
                codes.append(error.code())
                await asyncio.sleep(0.1)
        assert set(codes) <= {grpc.StatusCode.UNAVAILABLE}
        assert back.received == [refused]
        samples = await scrape(processor)
        assert series(samples, ERRORS)[("UNAVAILABLE",)] >= 2
        spans = series(samples, SPANS)
        assert spans[("forwarded",)] == 10
        assert spans[("received",)] == spans[("forwarded",)] + spans[("rejected",)]
        # The retried spans were detected once: the cycle of that trace counts once.
        assert processor.detector.cycles == {("cross_function", "planner>budget>planner"): 2}
    finally:
        await back.stop()
    assert sink.received == [delivered_before]


async def test_slow_downstream_is_resource_exhausted_with_retry_info(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address, forward_timeout=0.3, retry_after=1.5)
    sink.delay = 2.0
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, encode(*loop_trace().spans))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert retry_delay(caught.value) == 1.5
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=encode(*loop_trace().spans),
            headers={"Content-Type": "application/x-protobuf"},
        )
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "2"
    assert series(await scrape(processor), ERRORS) == {("timeout",): 2}


async def test_too_many_in_flight_is_resource_exhausted(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address, max_inflight=1)
    sink.delay = 0.5
    first = asyncio.ensure_future(export(processor, encode(*loop_trace().spans)))
    await asyncio.wait_for(sink.arrived.wait(), 10)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, encode(*loop_trace().spans))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert retry_delay(caught.value) is not None
    await first
    assert series(await scrape(processor), ERRORS) == {("busy",): 1}
    assert sum(processor.detector.cycles.values()) == 1  # the refused one was not detected


async def test_a_permanent_downstream_error_is_passed_on_without_retry(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sink.fail_with = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, encode(*loop_trace().spans))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the sink says no" in (caught.value.details() or "")
    assert retry_delay(caught.value) is None
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=encode(*loop_trace().spans),
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 400  # that body is not JSON: refused before forwarding
    assert json.loads(response.content)["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def test_a_failed_request_leaves_no_cycle_holding_its_bytes(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    # A downstream error holds the frames it passed, which hold the request: kept in a cycle, the
    # bytes outlived their budget until the collector ran (rarely, as the processor tunes it: the
    # worst-case test's processor grew past 1 GiB).
    processor = await start_processor(forward=sink.address)
    sink.fail_with = grpc.StatusCode.UNAVAILABLE
    gc.collect()
    gc.disable()
    try:
        sent = [export(processor, encode(*loop_trace().spans)) for _ in range(8)]  # joined and alone
        answers = await asyncio.gather(*sent, return_exceptions=True)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        ours = [
            garbage.f_code.co_qualname
            for garbage in gc.garbage
            if isinstance(garbage, types.FrameType) and "otel_guard_processor" in garbage.f_code.co_filename
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert all(isinstance(answer, grpc.aio.AioRpcError) for answer in answers), answers
    assert {answer.code() for answer in answers if isinstance(answer, grpc.aio.AioRpcError)} == {
        grpc.StatusCode.UNAVAILABLE
    }
    assert not ours, ours


async def test_without_forward_it_is_a_sink(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    assert await export(processor, encode(*loop_trace().spans)) == b""
    samples = await scrape(processor)
    assert series(samples, SPANS) == {("received",): 5}


async def test_downstream_failures_are_logged_once_a_minute_with_their_code(
    start_processor: ProcessorFactory, sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    processor = await start_processor(forward=sink.address)
    sink.fail_with = grpc.StatusCode.UNAVAILABLE
    caplog.set_level("WARNING", logger="otel_guard_processor")
    for _ in range(5):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await export(processor, encode(*loop_trace().spans))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    lines = [r.getMessage() for r in caplog.records if "forwarding to" in r.getMessage()]
    assert len(lines) == 1, lines  # an outage is one line a minute, not one a request
    assert sink.address in lines[0]
    assert "UNAVAILABLE" in lines[0]
    assert "5 spans handed back to the client to retry" in lines[0]
    assert series(await scrape(processor), ERRORS) == {("UNAVAILABLE",): 5}
    # The next report, a minute on, says how many it left out.
    processor.pipeline._downstream_logged["UNAVAILABLE"] -= 61
    with pytest.raises(grpc.aio.AioRpcError):
        await export(processor, encode(*loop_trace().spans))
    lines = [r.getMessage() for r in caplog.records if "forwarding to" in r.getMessage()]
    assert len(lines) == 2
    assert "4 more such failures since the last report" in lines[1]
