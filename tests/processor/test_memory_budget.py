"""The processor's one memory budget (``--max-pending-bytes``), against the real processor.

Every holder of request bytes draws from one ``MemoryBudget``: the gRPC receiver's calls (from
their first frame until they are answered and detected), HTTP bodies as their chunks arrive, what
gzip inflates to, the OTLP/JSON conversion's share (``JSON_HELD`` times the body), requests waiting
for detection or the downstream and the gRPC client's copy while one is forwarded, the forwarder's
joins and split parts. A request past it is answered RESOURCE_EXHAUSTED / 429 with a retry delay at
once, never held. Held bytes are sampled from a thread, so a sample can fall between any two steps
of the event loop or the receiver's thread.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import grpc.aio
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_guard_processor._engine import MemoryBudget
from otel_guard_processor.budget_shares import PROTOCOL_SHARE
from otel_guard_processor.conversion import JSON_HELD
from otel_guard_processor.service import Processor
from processor_helpers import EXPORT, ProcessorFactory, Sink, grpc_address, http_url, scrape, series
from processor_spans import Trace, encode

MIB = 1 << 20
JSON = {"Content-Type": "application/json"}


def padded_request(size: int) -> bytes:
    """A valid trace request of about ``size`` bytes (one agent span with a long attribute)."""
    trace = Trace()
    trace.agent("planner", attributes={"prompt": "x" * size})
    return encode(*trace.spans)


def json_request(size: int) -> bytes:
    """An OTLP/JSON trace request of about ``size`` bytes, in spans of about 400 bytes."""
    spans = []
    for _ in range(max(1, size // 400)):
        spans.append(
            {
                "traceId": os.urandom(16).hex(),
                "spanId": os.urandom(8).hex(),
                "name": "invoke_agent planner",
                "kind": 1,
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000000100000000",
                "attributes": [
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}},
                    {"key": "gen_ai.agent.name", "value": {"stringValue": "planner"}},
                    {"key": "gen_ai.prompt", "value": {"stringValue": "x" * 120}},
                ],
            }
        )
    document = {"resourceSpans": [{"scopeSpans": [{"scope": {"name": "agents"}, "spans": spans}]}]}
    return json.dumps(document).encode()


def retry_delay(error: grpc.aio.AioRpcError) -> float | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


@contextmanager
def sampled(processor: Processor) -> Iterator[list[int]]:
    """The budget's held bytes, sampled every millisecond on a thread of its own while inside."""
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(processor.budget.used)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield samples
    finally:
        done.set()
        sampler.join(5)


def test_a_reservation_gives_its_bytes_back_on_every_path() -> None:
    budget = MemoryBudget(100)
    failing = budget.empty()
    assert failing.grow(60)
    assert budget.reserve(50) is None, "60 of 100 held by another"
    with pytest.raises(RuntimeError), failing:
        raise RuntimeError("a failure inside")
    assert budget.used == 0, "given back when the with block ended by an exception"
    held = budget.reserve(60)
    assert held is not None
    del held
    gc.collect()
    assert budget.used == 0, "given back when collected"
    alone = budget.reserve(500)
    assert alone is not None, "nothing else held: one request is always taken, whatever its size"
    assert not alone.grow(0) or budget.used == 500
    moved = alone.hand_over()
    assert (alone.bytes, moved.bytes, budget.used) == (0, 500, 500)
    alone.release()
    assert budget.used == 500
    assert moved.resize(40)
    assert budget.used == 40
    moved.release()
    moved.release()
    assert (budget.used, moved.grow(1)) == (0, False)


async def test_a_body_is_held_as_it_arrives_and_past_the_budget_refused_before_it_ends(
    start_processor: ProcessorFactory,
) -> None:
    """Six uploads of 600 KB begun and not finished, against a budget of 2 MiB (OTLP/HTTP's share
    of it 1.5 MiB): two are held, the others answered 429 with Retry-After at once, their last
    bytes never sent. Before, every body was gathered whole outside any budget and nobody was
    answered until it ended."""
    processor = await start_processor(max_pending_bytes=2 * MIB)
    assert processor.http is not None
    body = padded_request(600_000)
    head = (
        f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    uploads = []
    with sampled(processor) as samples:
        for _ in range(6):
            reader, writer = await asyncio.open_connection("127.0.0.1", processor.http.port)
            writer.write(head + body[:-100])  # all but the last 100 bytes
            await writer.drain()
            uploads.append((reader, writer))
            await asyncio.sleep(0.05)

        async def first_line(reader: asyncio.StreamReader) -> bytes:
            try:
                return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.5)
            except TimeoutError:
                return b""

        heads = await asyncio.gather(*(first_line(reader) for reader, _ in uploads))
    refused = [answer for answer in heads if answer]
    assert len(refused) == 4, heads
    assert all(
        answer.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in answer.lower() for answer in refused
    )
    assert max(samples) <= 2 * MIB * PROTOCOL_SHARE, max(samples)
    assert max(samples) >= 2 * (len(body) - 100), "the bodies being received are held"
    for (reader, writer), answer in zip(uploads, heads, strict=True):
        if not answer:  # held: it ends, and is taken
            writer.write(body[-100:])
            await writer.drain()
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 200")
        writer.close()
    await processor.detection.settled()
    assert processor.budget.used == 0


async def test_a_json_body_holds_its_conversions_share_and_a_second_is_refused(
    start_processor: ProcessorFactory,
) -> None:
    """Two 400 KB OTLP/JSON bodies at once against 10 MiB (OTLP/HTTP's share of it 7.5 MiB): the
    first converts holding JSON_HELD times itself (5.6 MB), so the second does not fit and is
    answered 429. Before, a body in conversion held its own bytes only (the workers' 13 times it
    outside any budget): both taken."""
    processor = await start_processor(max_pending_bytes=10 * MIB)
    body = json_request(300_000)
    async with httpx.AsyncClient(timeout=30) as client:
        with sampled(processor) as samples:
            answers = await asyncio.gather(
                *(client.post(http_url(processor), content=body, headers=JSON) for _ in range(2))
            )
    assert sorted(answer.status_code for answer in answers) == [200, 429], [a.content[:200] for a in answers]
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    assert "max_pending_bytes" in refused.json()["message"]
    assert max(samples) >= JSON_HELD * len(body), (max(samples), len(body))
    assert max(samples) <= 10 * MIB * PROTOCOL_SHARE
    await processor.detection.settled()
    assert processor.budget.used == 0


async def test_a_json_flood_beside_grpc_calls_in_flight_never_holds_more_than_the_budget(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    """OTLP/JSON senders and gRPC senders at once, for 3 s, with every request waiting 0.3 s for
    the downstream: what is held (sampled on a thread) never passes the budget, some requests are
    taken and some told to retry, and nothing is held once they are answered."""
    limit = 6 * MIB
    processor = await start_processor(forward=sink.address, max_pending_bytes=limit)
    sink.delay = 0.3
    body, raw = json_request(200_000), padded_request(200_000)
    outcomes: dict[str, list[object]] = {"http": [], "grpc": []}
    ends = time.monotonic() + 3.0

    async def http_sender() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while time.monotonic() < ends:
                answer = await client.post(http_url(processor), content=body, headers=JSON)
                outcomes["http"].append(answer.status_code)
                if answer.status_code == 429:
                    await asyncio.sleep(0.02)

    async def grpc_sender() -> None:
        async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            while time.monotonic() < ends:
                try:
                    await call(raw, timeout=10)
                    outcomes["grpc"].append((grpc.StatusCode.OK, None))
                except grpc.aio.AioRpcError as error:
                    outcomes["grpc"].append((error.code(), retry_delay(error)))
                    await asyncio.sleep(0.02)

    with sampled(processor) as samples:
        await asyncio.gather(*(http_sender() for _ in range(3)), *(grpc_sender() for _ in range(6)))
    assert max(samples) <= limit, (max(samples), limit)
    # Every answer is taken or retry-later; which sender wins the budget's room is not promised
    # (on a loaded machine the gRPC senders may hold it all for the 3 s), but both answers come.
    assert set(outcomes["http"]) <= {200, 429}, outcomes["http"]
    assert set(outcomes["grpc"]) <= {(grpc.StatusCode.OK, None), (grpc.StatusCode.RESOURCE_EXHAUSTED, 1.0)}
    assert 200 in outcomes["http"] or (grpc.StatusCode.OK, None) in outcomes["grpc"]
    assert 429 in outcomes["http"] or (grpc.StatusCode.RESOURCE_EXHAUSTED, 1.0) in outcomes["grpc"]
    await processor.detection.settled()
    assert processor.budget.used == 0


async def test_a_stalled_downstream_fills_the_budget_and_receivers_answer_retry_later(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    """A downstream that takes 2 s a request, and 24 gRPC requests of 100 KB at once against a
    budget of 2 MiB: each request forwarded holds twice its bytes (it and the gRPC client's copy),
    so at most 10 are taken; the rest are answered RESOURCE_EXHAUSTED with RetryInfo at once, and
    counted as busy. Before, 20 were taken (the copies held outside the count) beside what the
    receiver held in a budget of its own."""
    limit = 2 * MIB
    processor = await start_processor(forward=sink.address, max_pending_bytes=limit, retry_after=0.5)
    sink.delay = 2.0
    raw = padded_request(100_000)

    async def send(channel: grpc.aio.Channel) -> tuple[grpc.StatusCode, float, float | None]:
        started = time.monotonic()
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        try:
            await call(raw, timeout=10)
            return grpc.StatusCode.OK, time.monotonic() - started, None
        except grpc.aio.AioRpcError as error:
            return error.code(), time.monotonic() - started, retry_delay(error)

    channels = [grpc.aio.insecure_channel(grpc_address(processor)) for _ in range(4)]
    try:
        for channel in channels:
            await channel.channel_ready()
        with sampled(processor) as samples:
            results = await asyncio.gather(*(send(channels[n % 4]) for n in range(24)))
    finally:
        for channel in channels:
            await channel.close()
    taken = [result for result in results if result[0] == grpc.StatusCode.OK]
    refused = [result for result in results if result[0] != grpc.StatusCode.OK]
    assert 1 <= len(taken) <= limit // (2 * len(raw)), (len(taken), len(raw))
    assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay == 0.5 for code, _, delay in refused)
    assert all(seconds < 1.0 for _, seconds, _ in refused), "refused at once, never held"
    assert max(samples) <= limit
    # Each request taken went downstream (some joined into one send with others).
    forwarded = sum(len(ExportTraceServiceRequest.FromString(sent).resource_spans) for sent in sink.received)
    assert forwarded >= len(taken), (forwarded, len(taken))
    await processor.detection.settled()
    assert processor.budget.used == 0
    requests = series(await scrape(processor), "otel_guard_processor_requests_total")
    assert requests[("busy", "grpc")] == len(refused)
