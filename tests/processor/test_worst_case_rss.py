"""Issue 41's attacks at once against one processor with the default bounds: its resident memory,
read from ``/proc`` while they run and at the end, stays under the worst case docs/processor.md
states for the defaults (*Memory*), and the part the request budget bounds stays within it.

The processor runs as a process of its own (the OTLP/JSON workers are its children, counted too),
forwarding to a sink that takes at most 4 MiB a request, as a Collector does. What a reader would
not guess: the attacks run for a fixed time, not to completion, and the held spans' bound (256 MiB)
is not reached here (that takes minutes; ``test_held_bytes.py`` holds that bound with a small
``--max-held-bytes``): the test holds the sum, and the parts it drives to their bound.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator

import grpc.aio
import httpx
import pytest
from processor_helpers import EXPORT, Sink, processor_process, ready_port
from processor_spans import Trace, encode, guard_attributes

MIB = 1 << 20
ATTACK_SECONDS = 10.0

# docs/processor.md, *Memory*: the worst case of the defaults, in MiB, as the sum of the bounds.
BASE = 64  # the interpreter, the engine, the listeners (50 measured idle)
WORKERS = 128  # the OTLP/JSON conversion's forkserver, resource tracker and two workers, idle
BUDGET = 128  # --max-pending-bytes: every request byte held, by any holder (JSON workers' share too)
ON_THE_LOOP = 16  # a body's join and a gRPC call's copy at take(), one at a time each
HELD = 262  # --max-held-bytes and what one check of it may pass it by
METRICS = 192  # four label families at 10,000 label sets of the longest labels, and the scrape
CONNECTIONS = 160  # 4,096 HTTP/2 connections at about 40 KiB each
WORST_CASE = BASE + WORKERS + BUDGET + ON_THE_LOOP + HELD + METRICS + CONNECTIONS

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0"


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(value: bytes) -> bytes:
    return bytes([len(value)]) + value


_HEADERS = (
    b"\x83\x86\x04"
    + _literal(EXPORT.encode())
    + b"\x01"
    + _literal(b"localhost")
    + b"\x0f\x10"
    + _literal(b"application/grpc")
    + b"\x00"
    + _literal(b"te")
    + _literal(b"trailers")
)


def resident_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            found = re.search(r"^VmRSS:\s+(\d+) kB", status.read(), re.MULTILINE)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return int(found.group(1)) / 1024 if found else 0.0


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as children:
                found.extend(int(child) for child in children.read().split())
    except (FileNotFoundError, ProcessLookupError):
        return found
    return found + [grandchild for child in found for grandchild in descendants(child)]


class Resident:
    """The processor's and its children's resident memory, sampled every 50 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_main = self.peak_total = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def now(self) -> tuple[float, float]:
        main = resident_mib(self.pid)
        return main, main + sum(resident_mib(child) for child in descendants(self.pid))

    def _run(self) -> None:
        while not self._done.is_set():
            main, total = self.now()
            self.peak_main, self.peak_total = max(self.peak_main, main), max(self.peak_total, total)
            time.sleep(0.05)

    def __enter__(self) -> Resident:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)


class FourMiBSink(Sink):
    max_receive_bytes = 4 * MIB


@pytest.fixture
async def four_mib_sink() -> AsyncIterator[Sink]:
    downstream = FourMiBSink()
    await downstream.start()
    yield downstream
    await downstream.stop()


def padded(size: int) -> bytes:
    trace = Trace()
    root = trace.agent("planner")
    for n in range(size // 100_000):
        trace.tool(f"lookup{n}", root, attributes={"result": "y" * 100_000})
    return encode(*trace.spans)


def json_body(size: int) -> bytes:
    """An OTLP/JSON trace request of about ``size`` bytes (at most)."""
    span = (
        '{"traceId":"%s","spanId":"%s","name":"invoke_agent planner","kind":1,'
        '"attributes":[{"key":"gen_ai.agent.name","value":{"stringValue":"planner"}},'
        '{"key":"gen_ai.prompt","value":{"stringValue":"' + "x" * 200 + '"}}]}'
    )
    one = len(span % ("0" * 32, "0" * 16)) + 1
    spans = ",".join(span % (os.urandom(16).hex(), os.urandom(8).hex()) for _ in range(size // one - 1))
    return ('{"resourceSpans":[{"scopeSpans":[{"spans":[' + spans + "]}]}]}").encode()


def long_chains(count: int) -> bytes:
    spans = []
    for _ in range(count):
        agents = ["\U0001d11e" * 200 + os.urandom(28).hex() for _ in range(64)]
        trace = Trace()
        spans.append(trace.agent(agents[-1], attributes=guard_attributes(agents)))
    return encode(*spans)


def long_labels(first: int, count: int) -> bytes:
    spans = []
    for n in range(first, first + count):
        trace = Trace()
        a, b = f"a{n}-".ljust(256, "\U0001d538"), f"b{n}-".ljust(256, "\U0001d538")
        refused = guard_attributes([a], decision="refuse", reason=f"r{n}-".ljust(256, "\U0001d538"))
        trace.agent(a, trace.agent(b, trace.agent(a, attributes=refused)))
        spans.extend(trace.spans)
    return encode(*spans)


@pytest.mark.integration
@pytest.mark.slow
async def test_every_attack_at_once_stays_under_the_stated_worst_case(four_mib_sink: Sink) -> None:
    args = ("--http-listen", "127.0.0.1:0", "--prometheus", "127.0.0.1:0", "--forward", four_mib_sink.address)
    with processor_process(*args) as (process, ready):
        assert process.stderr is not None
        # Its log (the long chains' loops are warnings of KiBs): read it all, or the pipe fills and
        # the processor waits on its own log with every request it holds.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        grpc_port, http_port = ready_port(ready, "OTLP/gRPC"), ready_port(ready, "OTLP/HTTP")
        metrics_url = f"http://127.0.0.1:{ready_port(ready, 'metrics')}/metrics"
        url = f"http://127.0.0.1:{http_port}/v1/traces"
        idle = resident_mib(process.pid)
        big, big_json = padded(7_900_000), json_body(7_800_000)
        bomb = gzip.compress(b"\0" * 16 * MIB)
        ends = time.monotonic() + ATTACK_SECONDS
        sockets: list[socket.socket] = []
        outcomes: dict[str, set[object]] = {}

        def note(what: str, outcome: object) -> None:
            outcomes.setdefault(what, set()).add(outcome)

        async def grpc_sender(what: str, requests: list[bytes], pause: float = 0.0) -> None:
            options = [("grpc.max_send_message_length", 32 * MIB)]
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options=options) as channel:
                call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
                while time.monotonic() < ends:
                    for raw in requests:
                        try:
                            await call(raw, timeout=10)
                            note(what, "OK")
                        except grpc.aio.AioRpcError as error:
                            note(what, error.code().name)
                        await asyncio.sleep(pause)

        async def http_sender(what: str, body: bytes, headers: dict[str, str]) -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                while time.monotonic() < ends:
                    try:
                        note(what, (await client.post(url, content=body, headers=headers)).status_code)
                    except httpx.TransportError as error:
                        note(what, type(error).__name__)

        async def scraper() -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                while time.monotonic() < ends:
                    note("scrape", (await client.get(metrics_url)).status_code)
                    await asyncio.sleep(0.3)

        def raw_floods() -> None:
            # Uploads of 7.9 MiB that never end (the read-timeout attack), HTTP/2 calls that send a
            # length prefix of 16 MiB and nothing more, and connections that send the preface only.
            head = (
                f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                f"Content-Length: {len(big)}\r\n\r\n"
            ).encode()
            for _ in range(40):
                upload = socket.create_connection(("127.0.0.1", http_port))
                upload.settimeout(10)
                upload.sendall(head + big[:-100])
                sockets.append(upload)
            for streams, declared in ((48, 16 * MIB), (1000, MIB)):
                half_open = socket.create_connection(("127.0.0.1", grpc_port))
                frames = [PREFACE]
                for index in range(streams):
                    frames.append(_frame(1, 0x4, 2 * index + 1, _HEADERS))
                    frames.append(_frame(0, 0, 2 * index + 1, b"\0" + struct.pack(">I", declared)))
                half_open.sendall(b"".join(frames))
                sockets.append(half_open)
            for _ in range(1000):
                idle_connection = socket.create_connection(("127.0.0.1", grpc_port))
                idle_connection.sendall(PREFACE)
                sockets.append(idle_connection)

        json_headers = {"Content-Type": "application/json"}
        bomb_headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        try:
            with Resident(process.pid) as resident:
                # First one OTLP/JSON body of 7.8 MB alone: nothing else held, it is taken, and its
                # conversion's share (in a worker, started for it) is in the budget too.
                alone_started = time.monotonic()
                async with httpx.AsyncClient(timeout=45) as client:
                    alone = (await client.post(url, content=big_json, headers=json_headers)).status_code
                print(f"a JSON body alone: {alone} in {time.monotonic() - alone_started:.1f} s")
                ends = time.monotonic() + ATTACK_SECONDS
                await asyncio.gather(
                    asyncio.to_thread(raw_floods),
                    *(grpc_sender("grpc 7.9 MiB", [big]) for _ in range(2)),
                    *(http_sender("json 7.8 MiB", big_json, json_headers) for _ in range(2)),
                    *(http_sender("gzip bomb", bomb, bomb_headers) for _ in range(2)),
                    grpc_sender("long chains", [long_chains(80) for _ in range(4)], pause=0.1),
                    grpc_sender("long labels", [long_labels(n, 250) for n in range(0, 2000, 250)], pause=0.1),
                    scraper(),
                )
                for sock in sockets:
                    sock.close()
                await asyncio.sleep(0.5)
                end_main, end_total = resident.now()
        finally:
            for sock in sockets:
                sock.close()
        assert process.poll() is None, "the processor lived through it"
    budget_part = BASE + BUDGET + ON_THE_LOOP + METRICS + CONNECTIONS
    report = (
        f"idle {idle:.0f} MiB; peak {resident.peak_main:.0f} MiB (processor), {resident.peak_total:.0f} MiB "
        f"(with its workers); end {end_main:.0f} / {end_total:.0f} MiB; stated {WORST_CASE} MiB; {outcomes}; "
        f"a JSON body alone: {alone}"
    )
    print(report)
    assert resident.peak_total <= WORST_CASE, report
    assert max(end_total, resident.peak_total) <= WORST_CASE, report
    # Without the workers and the held spans (about 30 MiB here, as the engine counts them), the
    # processor stays within the budget's part of the sum (340-355 MiB measured): before the one
    # budget, 532 MiB (the 40 uploads alone held 316 MiB, outside any count); before the
    # forwarder's errors let go of their frames, 400-1,130 MiB (requests refused downstream
    # outlived their budget in reference cycles until the collector ran).
    assert resident.peak_main <= budget_part, report
    # The attacks were served: each kind was taken or refused as the bounds say (which sender wins
    # the budget's room is not promised: on a loaded machine the JSON conversions may hold it for
    # the whole attack, and every 7.9 MiB call is told to retry).
    assert outcomes["grpc 7.9 MiB"], report
    assert outcomes["grpc 7.9 MiB"] <= {"OK", "RESOURCE_EXHAUSTED"}, report
    assert outcomes["json 7.8 MiB"] <= {200, 429}, report
    assert alone == 200, report
    assert outcomes["gzip bomb"] == {413} or outcomes["gzip bomb"] <= {413, 429}, report
    assert outcomes["scrape"] == {200}, report
