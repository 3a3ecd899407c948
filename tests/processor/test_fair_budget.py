"""Fairness of the one memory budget (``--max-pending-bytes``), against the real processor.

The budget refuses at once and holds nothing; these tests hold what it adds so that refusing is
fair: with OTLP/HTTP listening each receiver's requests hold at most three quarters of it (a
flood of OTLP/JSON, 14 times its body while it converts, leaves gRPC its quarter), and a request
refused for want of room has that room kept until a request as large comes back (a large call
retried as ``RetryInfo`` says gets through while small calls keep the budget busy). Each test
fails on the processor before the shares and the kept room (checked: OTLP/JSON held every byte
while gRPC calls were refused; the 6 MiB call was refused on every try).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import grpc
import grpc.aio
import httpx
import pytest
from otel_guard_processor._engine import MemoryBudget
from otel_guard_processor.budget_shares import keep_for, split
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.service import Processor
from processor_helpers import EXPORT, ProcessorFactory, Sink, grpc_address, http_url, scrape, series
from processor_spans import Trace, encode
from test_forwarding import retry_delay

MIB = 1 << 20
JSON = {"Content-Type": "application/json"}
SECONDS = 3.0


def padded_request(size: int) -> bytes:
    """A valid trace request of about ``size`` bytes (one agent span with a long attribute)."""
    trace = Trace()
    trace.agent("planner", attributes={"prompt": "x" * size})
    return encode(*trace.spans)


def json_request(size: int) -> bytes:
    """An OTLP/JSON trace request of about ``size`` bytes, in spans of about 400 bytes."""
    spans = [
        {
            "traceId": os.urandom(16).hex(),
            "spanId": os.urandom(8).hex(),
            "name": "invoke_agent planner",
            "kind": 1,
            "attributes": [
                {"key": "gen_ai.agent.name", "value": {"stringValue": "planner"}},
                {"key": "gen_ai.prompt", "value": {"stringValue": "x" * 250}},
            ],
        }
        for _ in range(max(1, size // 400))
    ]
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()


async def flood_beside_grpc(
    processor: Processor, body: bytes, raw: bytes, retry: bool, seconds: float = SECONDS
) -> tuple[list[int], list[list[str]]]:
    """Two OTLP/JSON flooders of four uploads at a time each, retrying at once when refused, and a
    gRPC client of one call at a time (retried after the delay its RetryInfo gives, with
    ``retry``), for SECONDS: the HTTP statuses, and each gRPC call's answers, try by try."""
    async with httpx.AsyncClient(timeout=30) as client:  # the JSON workers started, alone
        assert (await client.post(http_url(processor), content=body, headers=JSON)).status_code == 200
    ends = time.monotonic() + seconds
    json_answers: list[int] = []
    grpc_calls: list[list[str]] = []

    async def flooder() -> None:
        async with httpx.AsyncClient(timeout=30) as client:

            async def upload() -> None:
                while time.monotonic() < ends:
                    answer = await client.post(http_url(processor), content=body, headers=JSON)
                    json_answers.append(answer.status_code)

            await asyncio.gather(*(upload() for _ in range(4)))

    async def grpc_client() -> None:
        async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            while time.monotonic() < ends:
                tries: list[str] = []
                grpc_calls.append(tries)
                while len(tries) < 5:
                    try:
                        await call(raw, timeout=10)
                        tries.append("OK")
                        break
                    except grpc.aio.AioRpcError as error:
                        tries.append(error.code().name)
                        delay = retry_delay(error)
                        if not retry or delay is None:
                            break
                        await asyncio.sleep(delay)
                await asyncio.sleep(0.01)

    await asyncio.gather(flooder(), flooder(), grpc_client())
    return json_answers, grpc_calls


async def test_a_json_flood_within_its_share_leaves_grpc_its_quarter(
    start_processor: ProcessorFactory,
) -> None:
    """OTLP/JSON bodies of 380 KB (each holds 15 times itself while it arrives and converts: 5.7
    MB of the 9 MiB OTLP/HTTP share of a 12 MiB budget) from two flooders of four uploads at a
    time, and a gRPC client of one 1.5 MB call at a time: every gRPC call is taken at its first
    try (gRPC always has its quarter, 3 MiB: two calls, one answered and waiting for detection,
    and the next), and the JSON bodies are taken or told to retry. Before, the bodies held the
    whole budget between them and gRPC calls were refused."""
    processor = await start_processor(max_pending_bytes=12 * MIB)
    body, raw = json_request(300_000), padded_request(1_500_000)
    json_answers, grpc_calls = await flood_beside_grpc(processor, body, raw, retry=False)
    refused = sum(tries != ["OK"] for tries in grpc_calls)
    assert refused == 0, (refused, len(grpc_calls), json_answers.count(429))
    assert len(grpc_calls) >= 10, grpc_calls
    assert 200 in json_answers, sorted(set(json_answers))
    assert 429 in json_answers, sorted(set(json_answers))
    assert set(json_answers) <= {200, 429}, sorted(set(json_answers))
    await processor.detection.settled()
    assert processor.budget.used == 0


async def test_a_json_flood_past_its_share_leaves_grpc_calls_served(
    start_processor: ProcessorFactory,
) -> None:
    """OTLP/JSON bodies of 510 KB hold 7.7 MB each while they convert: more than OTLP/HTTP's share
    (6 MiB of 8 MiB), so each is taken only when nothing else is held and gRPC keeps no room for
    a refused call. Two flooders of them, and a gRPC client of one 1 MB call at a time retried as
    its RetryInfo says: every gRPC call is taken within two tries, and JSON bodies are taken
    too. Before, the JSON bodies held the budget nearly all the time and most gRPC calls were
    refused try after try."""
    processor = await start_processor(max_pending_bytes=8 * MIB)
    body, raw = json_request(400_000), padded_request(1_000_000)
    json_answers, grpc_calls = await flood_beside_grpc(processor, body, raw, retry=True, seconds=6.0)
    assert all(tries[-1] == "OK" and len(tries) <= 2 for tries in grpc_calls[:-1]), grpc_calls
    assert len(grpc_calls) >= 5, grpc_calls
    assert 200 in json_answers, sorted(set(json_answers))
    assert 429 in json_answers, sorted(set(json_answers))
    await processor.detection.settled()
    assert processor.budget.used == 0


@pytest.mark.parametrize("http_listen", ["127.0.0.1:0", None], ids=["shared", "grpc-only"])
async def test_a_large_call_retried_as_told_gets_through_beside_small_senders(
    start_processor: ProcessorFactory, sink: Sink, http_listen: str | None
) -> None:
    """Eight senders of six 256 KB calls at a time each keep a 24 MiB budget busy (each call held
    twice over while the downstream takes 0.3 s over it); a 6 MiB call, retried after the delay
    its RetryInfo gives, gets through within five tries: its first refusal keeps its room, so the
    small calls leave it free, and when it is refused again for the forwarder's copy, twice that.
    Before, the small calls took the room back each time and the 6 MiB call was refused on every
    try."""
    if http_listen is not None:
        processor = await start_processor(forward=sink.address, max_pending_bytes=24 * MIB, retry_after=0.5)
    else:  # the fixture's processors listen for OTLP/HTTP: this one not
        config = ProcessorConfig(
            listen="127.0.0.1:0",
            http_listen=None,
            prometheus="127.0.0.1:0",
            forward=sink.address,
            max_pending_bytes=24 * MIB,
            retry_after=0.5,
            count_wait=0.0,
            metrics_grace=0.0,
            drain_timeout=5.0,
        )
        processor = Processor(config)
        await processor.start()
    try:
        await large_beside_small(processor, sink)
    finally:
        if http_listen is None:
            await processor.stop()


async def large_beside_small(processor: Processor, sink: Sink) -> None:
    sink.delay = 0.3
    small, large = padded_request(256_000), padded_request(6 * MIB)
    done = asyncio.Event()
    small_answers: list[str] = []

    async def small_sender() -> None:
        async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

            async def one_at_a_time() -> None:
                while not done.is_set():
                    try:
                        await call(small, timeout=10)
                        small_answers.append("OK")
                    except grpc.aio.AioRpcError as error:
                        small_answers.append(error.code().name)
                        await asyncio.sleep(0.02)

            await asyncio.gather(*(one_at_a_time() for _ in range(6)))

    served_before_large: list[int] = []

    async def large_sender() -> list[str]:
        tries: list[str] = []
        options = [("grpc.max_send_message_length", 32 * MIB)]
        async with grpc.aio.insecure_channel(grpc_address(processor), options=options) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            await asyncio.sleep(0.5)  # the small senders fill the budget first
            served_before_large.append(small_answers.count("OK"))
            while len(tries) < 8:
                try:
                    await call(large, timeout=10)
                    tries.append("OK")
                    break
                except grpc.aio.AioRpcError as error:
                    tries.append(f"{error.code().name} {retry_delay(error)}")
                    await asyncio.sleep(retry_delay(error) or 0.5)
        done.set()
        return tries

    senders = [asyncio.create_task(small_sender()) for _ in range(8)]
    tries = await large_sender()
    await asyncio.gather(*senders)
    assert tries[-1] == "OK", tries
    assert len(tries) <= 5, tries
    assert set(tries[:-1]) <= {"RESOURCE_EXHAUSTED 0.5"}, tries
    # While the large call's room was kept, the small senders were still served (at least one call
    # each, on average: how many more depends on the machine's load, 48-150 measured).
    served = small_answers.count("OK") - served_before_large[0]
    assert served >= 8, f"the small senders kept being served: {served} calls"
    assert "RESOURCE_EXHAUSTED" in small_answers, "the budget was busy"
    samples = await scrape(processor)
    kept = series(samples, "otel_guard_processor_kept_room_total")
    if len(tries) > 1:
        assert kept[("kept", "grpc")] >= 1, kept
        assert kept[("claimed", "grpc")] >= 1, kept
        assert kept[("refused", "grpc")] >= 1, kept
    await processor.detection.settled()
    assert processor.budget.used == 0


def test_a_room_nobody_comes_back_for_is_let_go_of_and_counted() -> None:
    whole = MemoryBudget(100)
    share = whole.share(75, keep_for=0.2)
    held = [share.reserve(10) for _ in range(7)]
    large = share.empty()
    large.declare(30)
    assert not large.grow(30), "70 of 75 held"
    for reservation in held:
        assert reservation is not None
        reservation.release()
    assert share.kept_bytes == 30
    small = [share.reserve(10) for _ in range(6)]
    assert [reservation is not None for reservation in small] == [True] * 4 + [False] * 2, "30 left free"
    time.sleep(0.25)  # its sender never came back
    assert share.reserve(35) is not None, "the room let go of"
    assert share.kept_counts == {"kept": 1, "claimed": 0, "expired": 1, "refused": 2}


def test_the_split_and_its_bounds() -> None:
    both = split(128 * MIB, 1.0, http=True)
    assert both.http is not None
    assert (both.grpc.limit, both.http.limit, both.max_connection_bytes) == (96 * MIB, 96 * MIB, 64 * MIB)
    alone = split(128 * MIB, 1.0, http=False)
    assert (alone.http, alone.grpc.limit) == (None, 128 * MIB)
    assert (keep_for(0.5), keep_for(1.0), keep_for(1.5)) == (3.0, 3.0, 5.0)
    with pytest.raises(ValueError, match="keep_for must be a positive number of seconds"):
        MemoryBudget(10, keep_for=float("nan"))
    with pytest.raises(ValueError, match="at least 1 byte"):
        MemoryBudget(10).share(0)
