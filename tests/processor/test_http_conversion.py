"""OTLP/HTTP bodies made protobuf off the event loop: large OTLP/JSON and gzip bombs leave the
gRPC clients answered, a bomb costs the inflation of the limit, never of the bomb, and the bytes in
conversion are bounded by ``--max-pending-bytes``."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import statistics
import time
import zlib

import grpc
import grpc.aio
import httpx
import psutil
import pytest
from google.rpc import status_pb2  # type: ignore[import-untyped]
from processor_helpers import EXPORT, ProcessorFactory, Sink, http_url, processor_process, ready_port
from processor_spans import Trace, encode

JSON = {"Content-Type": "application/json"}
PROTOBUF = {"Content-Type": "application/x-protobuf"}


def large_json(size: int) -> bytes:
    """An OTLP/JSON trace request of about ``size`` bytes: agent-like spans, hex ids."""
    spans: list[dict[str, object]] = []
    while not spans or len(spans) * len(json.dumps(spans[0])) < size - 100:
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


def small_request() -> bytes:
    trace = Trace()
    trace.agent("planner")
    return encode(*trace.spans)


@pytest.mark.integration
@pytest.mark.slow
async def test_large_json_bodies_leave_grpc_clients_answered(sink: Sink) -> None:
    body = large_json(7_800_000)
    args = ("--http-listen", "127.0.0.1:0", "--prometheus", "127.0.0.1:0", "--forward", sink.address)
    with processor_process(*args) as (_process, ready):
        grpc_port, http_port = ready_port(ready, "OTLP/gRPC"), ready_port(ready, "OTLP/HTTP")
        url = f"http://127.0.0.1:{http_port}/v1/traces"
        metrics = f"http://127.0.0.1:{ready_port(ready, 'metrics')}/metrics"

        async def sender() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                while True:
                    response = await client.post(url, content=body, headers=JSON)
                    assert response.status_code in (200, 429), response.content[:300]

        senders = [asyncio.create_task(sender()) for _ in range(2)]
        answered: list[float] = []
        missed: list[str] = []
        try:
            # Until both bodies are in conversion (counted in the pending bytes), 3 s at most.
            deadline = time.monotonic() + 3
            async with httpx.AsyncClient(timeout=10) as client:
                while time.monotonic() < deadline and await pending_bytes(client, metrics) < 2 * len(body):
                    await asyncio.sleep(0.05)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
                await export(small_request(), timeout=10)  # connected

                async def client() -> None:
                    started = time.perf_counter()
                    try:
                        await export(small_request(), timeout=2.0)
                        answered.append(time.perf_counter() - started)
                    except grpc.aio.AioRpcError as error:
                        missed.append(error.code().name)

                # Rounds of ten clients for 3 s, longer than one body's conversion, while the
                # senders keep sending.
                rounds_end = time.monotonic() + 3
                while time.monotonic() < rounds_end:
                    await asyncio.gather(*(client() for _ in range(10)), asyncio.sleep(0.3))
        finally:
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
    assert not missed, (missed, answered)
    assert len(answered) >= 50


async def pending_bytes(client: httpx.AsyncClient, metrics: str) -> float:
    text = (await client.get(metrics)).text
    found = re.search(r"^otel_guard_processor_pending_bytes ([0-9.e+]+)$", text, re.MULTILINE)
    assert found, text[:2000]
    return float(found.group(1))


@pytest.mark.integration
async def test_conversion_workers_end_with_a_killed_processor(sink: Sink) -> None:
    body = large_json(300_000)
    args = ("--http-listen", "127.0.0.1:0", "--prometheus", "off", "--forward", sink.address)
    with processor_process(*args) as (process, ready):
        url = f"http://127.0.0.1:{ready_port(ready, 'OTLP/HTTP')}/v1/traces"
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(url, content=body, headers=JSON)
        assert response.status_code == 200
        workers = psutil.Process(process.pid).children(recursive=True)
        assert len(workers) >= 2  # the forkserver and its workers (and the resource tracker)
        process.kill()
        process.wait(10)
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    for left in alive:
        left.kill()
    assert not alive, [" ".join(left.cmdline())[:100] for left in alive]


def bomb(inflated: int) -> bytes:
    return gzip.compress(b"\0" * inflated, compresslevel=9)


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.mark.integration
@pytest.mark.slow
async def test_gzip_bombs_cost_the_limit_and_probes_stay_answered(sink: Sink) -> None:
    limit = 8 << 20  # the default max_request_bytes
    payload = bomb(16 * limit)  # 128 KB that inflate to 128 MiB
    started = time.process_time()
    for _ in range(3):
        assert len(zlib.decompress(payload, wbits=31)) == 16 * limit
    whole = (time.process_time() - started) / 3  # a bomb inflated whole

    args = ("--http-listen", "127.0.0.1:0", "--prometheus", "off", "--forward", sink.address,
            "--max-request-bytes", str(limit))  # fmt: skip
    with processor_process(*args) as (process, ready):
        grpc_port, http_port = ready_port(ready, "OTLP/gRPC"), ready_port(ready, "OTLP/HTTP")
        url = f"http://127.0.0.1:{http_port}/v1/traces"
        watched = psutil.Process(process.pid)
        headers = {**PROTOBUF, "Content-Encoding": "gzip"}
        async with (
            httpx.AsyncClient(timeout=30) as client,
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
        ):
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

            async def probes(count: int) -> list[float]:
                latencies = []
                for _ in range(count):
                    begun = time.perf_counter()
                    await export(small_request(), timeout=10)
                    latencies.append(time.perf_counter() - begun)
                return latencies

            idle = await probes(20)
            bombs = 0
            flooding = True

            async def bomber() -> None:
                nonlocal bombs
                while flooding:
                    response = await client.post(url, content=payload, headers=headers)
                    assert response.status_code == 413, response.content[:300]
                    bombs += 1

            cpu_before = cpu_seconds(watched)
            bombers = [asyncio.create_task(bomber()) for _ in range(4)]
            await asyncio.sleep(0.2)
            try:
                flooded = await probes(40)
            finally:
                flooding = False
                await asyncio.gather(*bombers)
            cpu = cpu_seconds(watched) - cpu_before
    per_bomb = cpu / bombs
    # A bomb costs about the inflation of the limit (1/16 of the bomb) and the request's handling,
    # never the inflation of the whole bomb.
    print(
        f"bomb: {per_bomb * 1e3:.1f} ms of CPU, inflated whole {whole * 1e3:.1f} ms; probes' p50 "
        f"{statistics.median(idle) * 1e3:.2f} ms idle, {statistics.median(flooded) * 1e3:.2f} ms flooded"
    )
    assert per_bomb < whole / 4, (per_bomb, whole, bombs)
    # The probes are answered while the bombs are inflated off the loop.
    assert statistics.median(flooded) < max(10 * statistics.median(idle), 0.010), (
        statistics.median(idle),
        statistics.median(flooded),
        bombs,
    )


async def test_bytes_in_conversion_count_against_max_pending_bytes(start_processor: ProcessorFactory) -> None:
    body = large_json(600_000)
    processor = await start_processor(max_pending_bytes=1_000_000)
    async with httpx.AsyncClient(timeout=30) as client:
        responses = await asyncio.gather(
            *(client.post(http_url(processor), content=body, headers=JSON) for _ in range(4))
        )
        statuses = sorted(response.status_code for response in responses)
        assert statuses[0] == 200
        assert 429 in statuses, statuses
        for response in responses:
            if response.status_code == 429:
                assert int(response.headers["Retry-After"]) >= 1
                assert "max_pending_bytes" in json.loads(response.content)["message"]
        await processor.detection.settled()
        assert processor.stats.pending_bytes == 0
        # The same, gzipped: what a body inflates to is counted as it inflates.
        packed = gzip.compress(body)
        gzip_headers = {**JSON, "Content-Encoding": "gzip"}
        responses = await asyncio.gather(
            *(client.post(http_url(processor), content=packed, headers=gzip_headers) for _ in range(4))
        )
        statuses = sorted(response.status_code for response in responses)
        assert statuses[0] == 200
        assert 429 in statuses, statuses
    await processor.detection.settled()
    assert processor.stats.pending_bytes == 0


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("traces", b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "a", "kind": 1e400}]}]}]}',
         "resourceSpans[0].scopeSpans[0].spans[0].kind"),
        ("traces", b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": -1e999}]}, {"spans": []}]}]}',
         "resourceSpans[0].scopeSpans[0].spans[0].kind"),
        ("metrics", b'{"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"sum": {"aggregationTemporality": '
         b'1e400}}]}]}]}', "resourceMetrics[0].scopeMetrics[0].metrics[0].sum.aggregationTemporality"),
        ("logs", b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"severityNumber": 1e400}]}]}]}',
         "resourceLogs[0].scopeLogs[0].logRecords[0].severityNumber"),
    ],
)  # fmt: skip
async def test_a_number_past_an_integer_is_a_400_saying_where(
    start_processor: ProcessorFactory, path: str, body: bytes, where: str
) -> None:
    processor = await start_processor()
    async with httpx.AsyncClient() as client:
        for content, headers in ((body, JSON), (gzip.compress(body), {**JSON, "Content-Encoding": "gzip"})):
            response = await client.post(http_url(processor).replace("traces", path), content=content,
                                         headers=headers)  # fmt: skip
            assert response.status_code == 400, response.content
            status = json.loads(response.content)
            assert status["code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert where in status["message"], status


async def test_a_body_larger_once_inflated_is_413_before_it_is_all_inflated(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor(max_request_bytes=1 << 20)
    payload = bomb(256 << 20)  # 256 MiB: inflated whole, the test would take seconds
    async with httpx.AsyncClient(timeout=30) as client:
        started = time.perf_counter()
        response = await client.post(
            http_url(processor), content=payload, headers={**PROTOBUF, "Content-Encoding": "gzip"}
        )
        took = time.perf_counter() - started
    assert response.status_code == 413
    assert "max_request_bytes" in status_pb2.Status.FromString(response.content).message
    assert processor.stats.pending_bytes == 0
    assert took < 2.0
