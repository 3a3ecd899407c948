"""One client's large request beside another client's small ones, and a bound on what is held.

Detection runs behind the answers (``otel_guard_processor.detection``), a large request's on a
worker thread with the interpreter lock released: a small request is answered while a 100,000-span
trace is being detected. When the requests held (waiting for the downstream's answer or for detection)
fill ``max_pending_bytes``, the next one is refused with RESOURCE_EXHAUSTED / 429 and a retry
delay, before anything is forwarded, and is taken when it comes again. Times are compared with a
reference measured in the same test, never with a fixed figure.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import grpc.aio
import httpx
import pytest
from otel_guard_processor.bounds import DetectorLimits
from otel_guard_processor.engine import EngineDetector
from otel_guard_processor.service import Processor
from processor_helpers import EXPORT, ProcessorFactory, Sink, export, grpc_address, http_url, scrape, series
from processor_spans import Trace, encode
from test_forwarding import retry_delay

LARGE_SPANS = 100_000
SMALL_REQUESTS_AT_LEAST = 3  # sent and answered while the large trace was being detected


def one_large_trace() -> bytes:
    """One trace of LARGE_SPANS spans: an agent, a tool call in every tenth span, the rest steps."""
    trace = Trace()
    root = trace.agent("planner")
    parent = root
    while len(trace.spans) < LARGE_SPANS:
        if len(trace.spans) % 10 == 1:
            parent = trace.tool(f"search_{len(trace.spans) % 97}", root)
        else:
            trace.span("step", parent)
    return encode(*trace.spans)


def small_trace() -> bytes:
    trace = Trace()
    trace.agent("budget", trace.agent("planner"))
    return encode(*trace.spans)


def detection_seconds(raw: bytes) -> float:
    """How long the detector alone takes on ``raw``, in this process, now."""
    detector = EngineDetector(DetectorLimits(max_spans_per_trace=2 * LARGE_SPANS))
    started = time.perf_counter()
    detector.ingest(raw, 0.0)
    return time.perf_counter() - started


@contextmanager
def detection_held(processor: Processor) -> Iterator[asyncio.Event]:
    """The detection queue held (nothing after this point is detected) until the event is set."""
    release = asyncio.Event()
    held = asyncio.get_running_loop().create_task(processor.detection.run(release.wait))
    try:
        yield release
    finally:
        release.set()
        held.cancel()


async def test_small_requests_are_answered_while_a_100k_span_trace_is_detected(
    start_processor: ProcessorFactory,
) -> None:
    large = one_large_trace()
    reference = detection_seconds(large)
    processor = await start_processor(max_spans_per_trace=2 * LARGE_SPANS, max_request_bytes=64 * 2**20)
    latencies: list[tuple[float, float]] = []  # (sent, answered) of each small request
    detected = asyncio.Event()

    async def small_client() -> None:
        async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            deadline = time.perf_counter() + 30.0  # bounded, whatever happens
            while not detected.is_set() and time.perf_counter() < deadline:
                sent = time.perf_counter()
                await call(small_trace(), timeout=30.0)
                latencies.append((sent, time.perf_counter()))

    client = asyncio.create_task(small_client())
    await asyncio.sleep(0.2)  # the small client is under way
    await export(processor, large, timeout=60.0)
    acknowledged = time.perf_counter()
    await processor.detection.settled()
    detected.set()
    await client
    # Sent while the large trace was being detected (its reception and parse, which any gRPC
    # server does in one go, are behind them).
    during = [answered - sent for sent, answered in latencies if sent >= acknowledged]
    assert len(during) >= SMALL_REQUESTS_AT_LEAST, (len(during), reference)
    # The large trace was detected (it holds one trace, whose spans were all kept) ...
    assert processor.detector.stored_spans >= LARGE_SPANS
    # ... and no small request waited for it: on the event loop, one would have waited about all
    # of `reference` (and no other been sent meanwhile). Most wait next to nothing; the slowest,
    # under a machine's other load, may wait more, never the whole detection.
    assert statistics.median(during) < reference / 10, (sorted(during), reference)
    assert max(during) < reference, (max(during), reference)


async def test_a_full_detection_queue_answers_retry_later_and_forwards_nothing(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    first, second = small_trace(), small_trace()
    processor = await start_processor(forward=sink.address, max_pending_bytes=len(first) + 1, retry_after=0.5)
    with detection_held(processor) as release:
        await export(processor, first)  # nothing waits: taken, whatever its size
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(processor, second)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert retry_delay(refused.value) == 0.5
        assert "max_pending_bytes" in (refused.value.details() or "")
        async with httpx.AsyncClient() as client:
            response = await client.post(
                http_url(processor), content=second, headers={"Content-Type": "application/x-protobuf"}
            )
        assert response.status_code == 429
        assert response.headers["Retry-After"] == "1"
        assert sink.received == [first]  # the refused request went nowhere
        release.set()
    await processor.detection.settled()
    await export(processor, second)  # the retry is taken
    assert sink.received == [first, second]
    samples = await scrape(processor)
    requests = series(samples, "otel_guard_processor_requests_total")
    assert requests[("busy", "grpc")] == 1
    assert requests[("busy", "http")] == 1
    # A refusal for a full queue is counted as a request; its spans are not read, so not counted.
    spans = series(samples, "otel_guard_processor_spans_total")
    assert (spans[("received",)], spans[("forwarded",)], spans.get(("rejected",), 0)) == (4, 4, 0)
    assert series(samples, "otel_guard_delegations_total") == {("budget", "planner"): 2}  # (callee, caller)
    assert series(samples, "otel_guard_processor_pending_bytes") == {}  # nothing held any more


async def test_requests_waiting_for_a_slow_downstream_count_toward_the_bound(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    first, second = small_trace(), small_trace()
    processor = await start_processor(forward=sink.address, max_pending_bytes=len(first) + 1)
    sink.delay = 1.0
    forwarding = asyncio.create_task(export(processor, first))
    await sink.arrived.wait()  # detected long since, but not yet answered: still held
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await export(processor, second)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await forwarding
    sink.delay = 0.0
    await export(processor, second)
    assert sink.received == [first, second]


async def test_a_scrape_counts_every_request_answered_before_it(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    with detection_held(processor) as release:
        for _ in range(3):
            await export(processor, small_trace())
        scraping = asyncio.create_task(scrape(processor))
        await asyncio.sleep(0.2)
        assert not scraping.done()  # it waits its turn behind the held detection
        release.set()
        samples = await scraping
    assert series(samples, "otel_guard_delegations_total") == {("budget", "planner"): 3}  # (callee, caller)


async def test_stop_detects_what_was_taken_before_it(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    with detection_held(processor) as release:
        await export(processor, small_trace())
        stopping = asyncio.create_task(processor.stop())
        await asyncio.sleep(0.1)
        release.set()
        await stopping
    assert processor.detector.delegations == {("planner", "budget"): 1}


async def test_a_request_is_detected_at_once_when_nothing_waits_for_detection(
    start_processor: ProcessorFactory,
) -> None:
    """One decode for both the check and detection: the pipeline's answer comes with the request
    already detected, with no turn of the event loop for a queue."""
    processor = await start_processor()
    assert processor.pipeline is not None
    answer = await processor.pipeline.export(small_trace(), "grpc")
    assert answer.code == grpc.StatusCode.OK
    assert processor.detector.delegations == {("planner", "budget"): 1}  # before any other task ran
    assert processor.stats.pending_bytes == 0  # answered and detected: nothing held


async def test_a_request_taken_while_detection_is_busy_waits_its_turn(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor()
    assert processor.pipeline is not None
    with detection_held(processor) as release:
        await asyncio.sleep(0)  # the held job is running
        raw = small_trace()
        answer = await processor.pipeline.export(raw, "grpc")
        assert answer.code == grpc.StatusCode.OK
        assert processor.detector.delegations == {}  # queued behind the held job
        assert processor.stats.pending_bytes == len(raw)
        release.set()
        await processor.detection.settled()
    assert processor.detector.delegations == {("planner", "budget"): 1}
    assert processor.stats.pending_bytes == 0


async def test_a_request_that_does_not_decode_changes_nothing_either_way(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor()
    assert processor.pipeline is not None
    broken = small_trace()[:-3]
    answer = await processor.pipeline.export(broken, "grpc")  # detected at once: refused
    assert answer.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an OTLP ExportTraceServiceRequest" in answer.message
    with detection_held(processor):
        await asyncio.sleep(0)
        queued = await processor.pipeline.export(broken, "grpc")  # checked before queueing
    assert (queued.code, queued.message) == (answer.code, answer.message)
    await processor.detection.settled()
    assert processor.detector.stored_spans == 0
    assert processor.stats.pending_bytes == 0
    assert processor.stats.spans["received"] == 0
