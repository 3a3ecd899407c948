"""The OTLP/gRPC receiver under hostile load, against the real processor: what it holds is bounded
in bytes and descriptors, and a well-behaved client is still answered.

Hostile senders speak HTTP/2 as raw frames on sockets (no HTTP/2 library: the frames a flood
needs are few, and a library would refuse to send what an attacker sends); the well-behaved
client is grpcio. The processes these tests start run with a lowered ``RLIMIT_NOFILE`` or
``RLIMIT_AS`` (set in the child only), so the limits are the real ones and the tests stay small.
"""

from __future__ import annotations

import asyncio
import re
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from otel_guard_processor.grpc_receiver import _details
from otel_guard_processor.pipeline import Answer
from processor_helpers import EXPORT, ProcessorFactory
from processor_spans import Trace, encode

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0"  # and an empty SETTINGS


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(value: bytes) -> bytes:
    assert len(value) < 127
    return bytes([len(value)]) + value


# HPACK, literals without indexing: :method POST, :scheme http (static 3 and 6), :path (4),
# :authority (1), content-type (31), te.
_HEADERS = (
    b"\x83\x86"
    + b"\x04"
    + _literal(EXPORT.encode())
    + b"\x01"
    + _literal(b"localhost")
    + b"\x0f\x10"
    + _literal(b"application/grpc")
    + b"\x00"
    + _literal(b"te")
    + _literal(b"trailers")
)


def _prefix_only_streams(port: int, streams: int, declared: int) -> socket.socket:
    """A connection opening ``streams`` calls that each send a length prefix of ``declared``
    bytes and nothing more."""
    sock = socket.create_connection(("127.0.0.1", port))
    frames = [PREFACE]
    for index in range(streams):
        stream = 2 * index + 1
        frames.append(_frame(1, 0x4, stream, _HEADERS))  # HEADERS, END_HEADERS
        frames.append(_frame(0, 0, stream, b"\0" + struct.pack(">I", declared)))  # DATA
    sock.sendall(b"".join(frames))
    return sock


@contextmanager
def _processor(*args: str, limit: Callable[[], None]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The processor as a process, ``limit`` applied in the child before it starts; its gRPC port."""
    command = [sys.executable, "-m", "otel_guard_processor", "--listen", "127.0.0.1:0", "--prometheus",
               "127.0.0.1:0", "--http-listen", "127.0.0.1:0", *args]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=limit)  # noqa: PLW1509 -- setrlimit only
    try:
        assert process.stderr is not None
        ready = process.stderr.readline()
        found = re.search(r"OTLP/gRPC on 127\.0\.0\.1:(\d+)", ready)
        assert found, ready + (process.stderr.read() if process.poll() is not None else "")
        yield process, int(found.group(1))
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def _request() -> bytes:
    trace = Trace()
    trace.agent("budget", trace.agent("planner"))
    return encode(*trace.spans)


def _export(port: int, timeout: float = 5.0) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary(EXPORT)(_request(), timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_a_flood_of_idle_connections_never_starves_a_grpc_client() -> None:
    """1,100 connections that send HTTP/2's preface and nothing more, against a processor with 256
    descriptors: each new one closes the idlest, and a grpcio client is answered all along."""

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    with _processor(limit=few_descriptors) as (process, port):
        answers: list[grpc.StatusCode] = []
        flooding = threading.Event()
        flooding.set()

        def client() -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                export = channel.unary_unary(EXPORT)
                while flooding.is_set():
                    try:
                        export(_request(), timeout=5)
                        answers.append(grpc.StatusCode.OK)
                    except grpc.RpcError as exc:
                        answers.append(exc.code())
                    time.sleep(0.02)

        calling = threading.Thread(target=client)
        calling.start()
        flood = []
        try:
            for _ in range(1100):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(PREFACE)
                flood.append(sock)
            time.sleep(0.5)
            assert _export(port) == grpc.StatusCode.OK, "a new client during the flood"
        finally:
            flooding.clear()
            calling.join(10)
            for sock in flood:
                sock.close()
        assert process.poll() is None
        assert answers
        assert set(answers) == {grpc.StatusCode.OK}, answers


def test_streams_of_only_a_length_prefix_do_not_abort_under_an_address_space_limit() -> None:
    """3,072 calls that each declare 16 MiB and send only their prefix, under ``ulimit -v`` of
    768 MiB above what the processor needs to start: nothing is reserved ahead of bytes, so it
    lives and answers."""
    with _processor(limit=lambda: None) as (probe, _), open(f"/proc/{probe.pid}/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmPeak:")) * 1024
    limit = peak + (768 << 20)

    def address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with _processor("--max-request-bytes", str(8 << 20), limit=address_space) as (process, port):
        attack = [_prefix_only_streams(port, 1024, 16 << 20) for _ in range(3)]
        try:
            time.sleep(1.0)
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert _export(port) == grpc.StatusCode.OK
        finally:
            for sock in attack:
                sock.close()


async def test_calls_the_event_loop_has_not_taken_are_bounded_and_refused_with_retry_info(
    start_processor: ProcessorFactory,
) -> None:
    """With the event loop busy, complete calls wait in the receiver: past ``max_pending_bytes``
    they are refused RESOURCE_EXHAUSTED at once, with the RetryInfo the pipeline's refusals carry,
    and the bytes held show in the pending-bytes metric."""
    processor = await start_processor(max_pending_bytes=2 << 20, max_request_bytes=1 << 20, retry_after=2.5)
    assert processor.grpc is not None
    port = processor.grpc.port
    body = b"\n" + b"\x80\xc4\x13" + b"\0" * 320_000  # one field of 320,000 bytes: never read here
    results: list[tuple[grpc.StatusCode, bytes, float]] = []

    def send(channel: grpc.Channel) -> None:
        started = time.monotonic()
        try:
            channel.unary_unary(EXPORT)(body, timeout=10)
            results.append((grpc.StatusCode.OK, b"", 0.0))
        except grpc.RpcError as exc:
            trailers = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
            results.append(
                (exc.code(), trailers.get("grpc-status-details-bin", b""), time.monotonic() - started)
            )

    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(6)]
    try:
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=5)
        senders = [threading.Thread(target=send, args=(channel,)) for channel in channels for _ in range(2)]
        # The loop is busy for 3 s (as with a large OTLP/JSON body): nothing is taken meanwhile.
        for sender in senders:
            sender.start()
        time.sleep(1.5)
        held = processor.grpc.held_bytes
        metric = processor.stats.pending_bytes
        refused_while_busy = [result for result in results if result[0] != grpc.StatusCode.OK]
        time.sleep(1.5)
        await asyncio.to_thread(lambda: [sender.join(10) for sender in senders])
    finally:
        for channel in channels:
            channel.close()
    assert 0 < held <= (2 << 20) + 5, held  # at most the budget: one whole message
    assert metric == held
    assert refused_while_busy, "some calls were refused while the loop was busy"
    code, details, seconds = refused_while_busy[0]
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert seconds < 1.0, "refused at once, never held"
    status = status_pb2.Status.FromString(details)
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry)
    assert (retry.retry_delay.seconds, retry.retry_delay.nanos) == (2, 500_000_000)
    expected = status_pb2.Status.FromString(
        _details(Answer(grpc.StatusCode.RESOURCE_EXHAUSTED, status.message, retry_after=2.5)) or b""
    )
    assert status == expected, "the same shape as the pipeline's refusals"
    assert processor.grpc.held_bytes == 0
