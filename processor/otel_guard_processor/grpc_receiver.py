"""The OTLP/gRPC receiver: ``TraceService/Export``, and ``MetricsService/Export`` and
``LogsService/Export`` for the signals passed on unread (:mod:`otel_guard_processor.signals`).

HTTP/2 and gRPC's framing run in the compiled engine, on a thread of their own that never takes
the interpreter lock (``GrpcServer``, processor/src/grpc): it reads each call whole, inflating
gzip up to ``max_request_bytes``, and refuses one larger than twice ``max_request_bytes``
(RESOURCE_EXHAUSTED) before it is read. A call's bytes, from its first frame, are drawn from the
processor's one memory budget (``max_pending_bytes``: the gRPC share of it,
:mod:`otel_guard_processor.budget_shares`, or the pipeline's whole :class:`MemoryBudget`), a
connection's calls being read at most half of the whole; a call past it is refused
RESOURCE_EXHAUSTED with the same ``RetryInfo`` as here. The reservation is handed over with the
call (:meth:`GrpcReply.reservation`) to the pipeline, so the bytes stay held until the request is
answered and detected. A call's ``grpc-timeout``
is honoured, its request must arrive within ``read_timeout``, a connection with no call is closed
after ``read_timeout``, and at :func:`max_connections` (below the descriptor limit) a new
connection closes the one idle the longest.

This module takes the calls that arrived, a batch at each wake-up of the event loop, and answers
each with what the pipeline says; the handler refuses a request larger than ``max_request_bytes``
with the same status and counts it. The handler gets the request's bytes
exactly as they arrived -- the bytes the forwarder sends on.

A retryable error carries a ``google.rpc.Status`` with a ``RetryInfo`` detail in the
``grpc-status-details-bin`` trailer, which the OpenTelemetry Collector's exporters read. A call
whose client resets it is cancelled here, as ``grpc.aio`` cancels its handler.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from functools import partial

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from otel_guard_processor._engine import METHODS, GrpcReply, GrpcServer, MemoryBudget, Reservation
from otel_guard_processor.config import parse_address
from otel_guard_processor.headers import BadHeader, Headers, pick
from otel_guard_processor.listeners import cannot_listen
from otel_guard_processor.pipeline import Answer, Pipeline
from otel_guard_processor.signals import UNREAD, Unread

__all__ = ["GrpcReceiver"]

_log = logging.getLogger("otel_guard_processor")

# The signal of each of the engine's METHODS: None for traces, read and detected.
_SIGNALS: tuple[Unread | None, ...] = tuple(
    next((signal for signal in UNREAD if signal.method == method), None) for method in METHODS
)


class GrpcReceiver:
    """The engine's gRPC server, its calls answered by the pipeline on the event loop."""

    def __init__(
        self,
        pipeline: Pipeline,
        address: str,
        max_request_bytes: int,
        *,
        read_timeout: float = 30.0,
        retry_after: float = 1.0,
        budget: MemoryBudget | None = None,
        max_connection_bytes: int | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._max_request_bytes = max_request_bytes
        host, port = parse_address(address, option="listen")
        try:
            self._server = GrpcServer(
                _addresses(host, port),
                port,
                2 * max_request_bytes,
                max_inflated_bytes=max_request_bytes,
                budget=pipeline.budget if budget is None else budget,
                max_connection_bytes=max_connection_bytes,
                max_connections=max_connections(),
                read_timeout=read_timeout,
                retry_after=retry_after,
                headers=pipeline.forward_headers,
            )
        except OSError as exc:
            raise cannot_listen("listen", address, "OTLP/gRPC", exc) from None
        self.port = self._server.port
        self.address = address
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refused = 0  # of the engine's refusals for want of budget, those counted in the stats

    @property
    def held_bytes(self) -> int:
        """Bytes held of the memory budget (by every holder: it is the pipeline's)."""
        return self._server.held_bytes

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server.start()
        self._loop.add_reader(self._server.wake_fd(), self._take)

    async def stop(self, grace: float) -> None:
        """Refuse new calls, let calls in flight finish for up to ``grace`` seconds."""
        # The loop keeps answering the calls in flight while the server's thread waits for them.
        await asyncio.to_thread(self._server.shutdown, grace)
        if self._loop is not None:
            self._loop.remove_reader(self._server.wake_fd())
            self._loop = None
        # Calls still in the server's queue are let go of with it: their replies can no longer be sent.
        unanswered = list(self._calls.values())
        for task in unanswered:
            task.cancel()
        await asyncio.gather(*unanswered, return_exceptions=True)

    def count_refusals(self) -> None:
        """Count the calls the engine refused for want of budget since the last count as busy
        requests (``otel_guard_processor_requests_total{outcome="busy"}``)."""
        refused = self._server.refused_busy
        for _ in range(refused - self._refused):
            self._pipeline.stats.request("grpc", "busy", 0, 0.0)
        self._refused = refused

    def _take(self) -> None:
        self.count_refusals()
        calls, cancelled = self._server.take()
        if calls:
            started = time.perf_counter()
            loop = asyncio.get_running_loop()  # a reader callback of the loop start() registered
            for call_id, method, raw, reply in calls:
                task = loop.create_task(self._export(_SIGNALS[method], raw, reply, started))
                self._calls[call_id] = task
                task.add_done_callback(partial(self._done, call_id))
        for call_id in cancelled:
            unanswered = self._calls.get(call_id)
            if unanswered is not None:
                unanswered.cancel()

    def _done(self, call_id: int, _: asyncio.Task[None]) -> None:
        del self._calls[call_id]

    async def _export(self, signal: Unread | None, raw: bytes, reply: GrpcReply, started: float) -> None:
        """One Export call: of traces (``signal`` None), or of metrics or logs."""
        with reply.reservation() as held:  # the request's bytes, until the pipeline takes them over
            try:
                answer = await self._answer(signal, raw, started, reply.headers, held)
            except Exception as exc:  # a bug: answered as grpc.aio answers a handler's exception
                _log.exception("otel-guard processor: an Export call failed")
                reply.fail(grpc.StatusCode.UNKNOWN.value[0], f"Unexpected {type(exc).__name__}: {exc}")
                return
        if answer.code == grpc.StatusCode.OK:
            reply.ok(answer.response)
        else:
            reply.fail(answer.code.value[0], answer.message, _details(answer))

    async def _answer(
        self,
        signal: Unread | None,
        raw: bytes,
        started: float,
        kept: list[tuple[str, bytes]],
        held: Reservation,
    ) -> Answer:
        if len(raw) > self._max_request_bytes:
            return self._pipeline.refuse(
                "grpc",
                "too_large",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request of {len(raw)} bytes is larger than max_request_bytes ({self._max_request_bytes})",
                len(raw),
                started,
            )
        headers: Headers = ()
        if kept:
            try:
                headers = pick(self._pipeline.forward_headers, lambda name: (v for n, v in kept if n == name))
            except BadHeader as exc:
                return self._pipeline.refuse("grpc", "invalid", grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                             len(raw), started)  # fmt: skip
        if signal is None:
            return await self._pipeline.export(raw, "grpc", started, headers, held)
        return await self._pipeline.export_unread(signal, raw, "grpc", started, headers, held)


def max_connections() -> int:
    """The most gRPC connections at once: the descriptor limit (``RLIMIT_NOFILE``'s soft limit)
    less a quarter of it (at least 64) for everything else the process opens, and at most 4,096
    (an idle HTTP/2 connection costs tens of kilobytes)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(1, min(4096, soft - max(64, soft // 4)))


def _addresses(host: str, port: int) -> list[str]:
    """The IP addresses ``host`` resolves to for listening, each once, in the resolver's order
    (gRPC listens on every one it can bind)."""
    resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return list(dict.fromkeys(str(where[0]) for *_, where in resolved))


def _details(answer: Answer) -> bytes | None:
    if answer.retry_after is None:
        return None
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(
            seconds=int(answer.retry_after), nanos=int(answer.retry_after % 1 * 1e9)
        )
    )
    status = status_pb2.Status(code=answer.code.value[0], message=answer.message)
    status.details.add().Pack(retry)
    return bytes(status.SerializeToString())
