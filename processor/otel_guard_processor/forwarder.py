"""Forwarding requests downstream, byte for byte, and turning its failures into retryable answers.

Every signal goes the same way, each to its own Export method on one channel, within one
``max_inflight``: traces, and the metrics and logs the processor passes on unread.

The processor never re-encodes a request: the bytes it received over OTLP/gRPC or OTLP/HTTP
protobuf are the bytes it sends (an OTLP/JSON request is sent in its protobuf encoding). The client
is acknowledged only after the downstream acknowledged, with the downstream's own response (so a
``partial_success`` reaches the client unchanged).

What a reader would not guess: while a send of a signal is in flight, the requests that arrive
wait and then go as one, their bytes joined (an Export request is one repeated field, so the join
is the request of all their resources), at most ``MERGE_BYTES`` a send; only a full one goes
beside those in flight (at most ``SENDS``). Each send costs
both sides a gRPC call, and under load this halves the processor's and the downstream's CPU a span
(``bench/processor_throughput.py``); an idle processor sends each request at once. Every client of a
joined send gets the downstream's answer to it; a ``partial_success`` says that it was for several
requests, and a permanent error is not taken as theirs: each request is then sent again alone, so
each client gets its own answer.

When the downstream cannot take the request the client is told to retry, as the OpenTelemetry
Collector's exporters expect, so their retry and sending queue keep the data:

==========================================  =====================  ==========
what happened                               gRPC status            HTTP
==========================================  =====================  ==========
downstream unreachable or UNAVAILABLE       UNAVAILABLE            503
downstream slower than ``forward_timeout``  RESOURCE_EXHAUSTED     429
``max_inflight`` requests already waiting   RESOURCE_EXHAUSTED     429
downstream said RESOURCE_EXHAUSTED          RESOURCE_EXHAUSTED     429
downstream said anything else               the same status        mapped
==========================================  =====================  ==========

Retryable answers carry a ``google.rpc.RetryInfo`` detail (gRPC) or ``Retry-After`` (HTTP) of
``retry_after`` seconds: the Collector retries RESOURCE_EXHAUSTED only when it carries one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Final

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_guard_processor.signals import UNREAD

__all__ = ["EXPORT_METHOD", "MERGE_BYTES", "METHODS", "SENDS", "DownstreamError", "Forwarder"]

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# Every signal's Export: traces, and the metrics and logs passed on unread (signals.py).
METHODS = (EXPORT_METHOD, *(signal.method for signal in UNREAD))
_RESPONSES: dict[str, type[Message]] = {
    EXPORT_METHOD: ExportTraceServiceResponse,
    **{signal.method: signal.response for signal in UNREAD},
}

SENDS: Final = 4
"""The most sends of one signal in flight: a second one starts only once ``MERGE_BYTES`` wait."""
MERGE_BYTES: Final = 4 * 1024 * 1024
"""The most bytes of requests joined into one send: what the OpenTelemetry Collector's OTLP
receiver takes by default (a larger request goes alone, as it came)."""


@dataclass
class DownstreamError(Exception):
    """The downstream did not acknowledge a request: the status to answer the client with."""

    code: grpc.StatusCode
    details: str
    retryable: bool
    reason: str  # for the downstream_errors metric: the status name, or busy / timeout

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class Forwarder:
    """One gRPC channel to the downstream, with a bound on requests in flight."""

    def __init__(self, target: str, *, timeout: float, max_inflight: int, max_message_bytes: int) -> None:
        self.target = target
        self._timeout = timeout
        self._max_inflight = max_inflight
        self._inflight = 0
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                # Reconnect soon after the downstream comes back: clients are retrying meanwhile.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 5000),
            ],
        )
        # No (de)serializers: requests and responses pass as the bytes they are.
        self._lanes = {
            method: _Lane(
                method,
                self._channel.unary_unary(method, request_serializer=None, response_deserializer=None),
            )
            for method in METHODS
        }
        self._sends: set[asyncio.Task[None]] = set()  # held, so that a send is never collected
        self._closed = False

    @property
    def inflight(self) -> int:
        return self._inflight

    def busy(self) -> DownstreamError | None:
        """The refusal :meth:`start` would raise now (``max_inflight`` requests already waiting),
        else None: nothing changes between this and a ``start`` with no ``await`` between them."""
        if self._inflight < self._max_inflight:
            return None
        return DownstreamError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{self._inflight} requests already waiting for the downstream {self.target}",
            retryable=True,
            reason="busy",
        )

    def start(self, raw: bytes, method: str = EXPORT_METHOD) -> asyncio.Future[bytes]:
        """Start sending ``raw`` to ``method`` (one of METHODS); the future gives the downstream's
        response bytes, or raises DownstreamError.

        Raises DownstreamError at once when ``max_inflight`` requests are already waiting (what
        :meth:`busy` says beforehand). The pipeline starts it once the request has been read: a
        request that does not decode is never forwarded.
        """
        busy = self.busy()
        if busy is not None:
            raise busy
        self._inflight += 1
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        # If the client goes away meanwhile nobody awaits the answer: retrieve it anyway, so a
        # failure is not reported as an exception never retrieved.
        answer.add_done_callback(_retrieve)
        lane = self._lanes[method]
        lane.waiting.append((raw, answer))
        lane.waiting_bytes += len(raw)
        if self._closed:
            self._fail_waiting(lane)
        else:
            self._pump(lane)
        return answer

    def _pump(self, lane: _Lane) -> None:
        """Send what waits when nothing is in flight, or a full send beside those that are."""
        while lane.waiting and (
            not lane.sending or (lane.waiting_bytes >= MERGE_BYTES and lane.sending < SENDS)
        ):
            self._send_next(lane)

    def _send_next(self, lane: _Lane) -> None:
        """Send what waits in ``lane``: the oldest request, and those after it while they fit in
        MERGE_BYTES; a request whose client went away is dropped."""
        group: list[tuple[bytes, asyncio.Future[bytes]]] = []
        size = 0
        waiting = lane.waiting
        while waiting:
            raw, answer = waiting[0]
            if group and size + len(raw) > MERGE_BYTES:
                break
            waiting.popleft()
            lane.waiting_bytes -= len(raw)
            if answer.done():  # cancelled: its client is gone and will send it again
                self._inflight -= 1
                continue
            group.append((raw, answer))
            size += len(raw)
        if not group:
            return
        lane.sending += 1
        sending = asyncio.get_running_loop().create_task(self._send(lane, group))
        self._sends.add(sending)
        sending.add_done_callback(self._sends.discard)

    async def _send(self, lane: _Lane, group: list[tuple[bytes, asyncio.Future[bytes]]]) -> None:
        try:
            raw = group[0][0] if len(group) == 1 else b"".join(raw for raw, _ in group)
            try:
                response = await self._call(lane, raw)
            except DownstreamError as error:
                if len(group) > 1 and not error.retryable:
                    # Perhaps one request's fault: each is sent alone and gets its own answer.
                    await asyncio.gather(*(self._send_alone(lane, item) for item in group))
                else:
                    for _, answer in group:
                        if not answer.done():
                            answer.set_exception(error)
            else:
                if len(group) > 1 and response:
                    response = _shared(lane.method, response, len(group))
                for _, answer in group:
                    if not answer.done():
                        answer.set_result(response)
        finally:
            self._inflight -= len(group)
            lane.sending -= 1
            if not self._closed:
                self._pump(lane)

    async def _send_alone(self, lane: _Lane, item: tuple[bytes, asyncio.Future[bytes]]) -> None:
        raw, answer = item
        try:
            response = await self._call(lane, raw)
        except DownstreamError as error:
            if not answer.done():
                answer.set_exception(error)
        else:
            if not answer.done():
                answer.set_result(response)

    async def _call(self, lane: _Lane, raw: bytes) -> bytes:
        try:
            response: bytes = await lane.export(raw, timeout=self._timeout)
            return response
        except grpc.aio.AioRpcError as exc:
            raise _downstream_error(exc, self.target, self._timeout) from None
        except Exception as exc:  # the channel closed under it (UsageError), or gRPC failed locally
            raise DownstreamError(
                grpc.StatusCode.UNAVAILABLE,
                f"could not send to the downstream {self.target}: {type(exc).__name__}: {exc}",
                retryable=True,
                reason="UNAVAILABLE",
            ) from None

    def _fail_waiting(self, lane: _Lane) -> None:
        error = DownstreamError(
            grpc.StatusCode.UNAVAILABLE,
            f"the processor is stopping; not sent to the downstream {self.target}",
            retryable=True,
            reason="UNAVAILABLE",
        )
        while lane.waiting:
            raw, answer = lane.waiting.popleft()
            lane.waiting_bytes -= len(raw)
            self._inflight -= 1
            if not answer.done():
                answer.set_exception(error)

    async def close(self) -> None:
        """Answer what still waits as unavailable (its clients retry), end the sends in flight."""
        self._closed = True
        for lane in self._lanes.values():
            self._fail_waiting(lane)
        await self._channel.close(grace=None)
        if self._sends:
            await asyncio.gather(*self._sends, return_exceptions=True)


class _Lane:
    """One signal's Export: the sends in flight and the requests waiting to go as one."""

    __slots__ = ("export", "method", "sending", "waiting", "waiting_bytes")

    def __init__(self, method: str, export: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]) -> None:
        self.method = method
        self.export = export
        self.sending = 0
        self.waiting: deque[tuple[bytes, asyncio.Future[bytes]]] = deque()
        self.waiting_bytes = 0


def _shared(method: str, response: bytes, requests: int) -> bytes:
    """The downstream's answer to ``requests`` requests sent as one, for each of their clients:
    a ``partial_success`` says it counts the spans (points, records) of all of them."""
    try:
        message = _RESPONSES[method].FromString(response)
    except DecodeError:
        return response  # not ours to read: passed on as the downstream wrote it
    if not message.HasField("partial_success"):
        return response
    partial = message.partial_success  # type: ignore[attr-defined]
    partial.error_message = (
        f"the downstream's answer to {requests} requests sent to it as one, this one among them"
        + (f": {partial.error_message}" if partial.error_message else "")
    )
    return message.SerializeToString()


def _retrieve(sending: asyncio.Future[bytes]) -> None:
    if not sending.cancelled():
        sending.exception()


def _downstream_error(exc: grpc.aio.AioRpcError, target: str, timeout: float) -> DownstreamError:
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DownstreamError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the downstream {target} did not answer within {timeout:g} s",
            retryable=True,
            reason="timeout",
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return DownstreamError(
            grpc.StatusCode.UNAVAILABLE,
            f"the downstream {target} is unavailable: {exc.details()}",
            retryable=True,
            reason=code.name,
        )
    retryable = code == grpc.StatusCode.RESOURCE_EXHAUSTED
    return DownstreamError(code, f"the downstream {target} answered: {exc.details()}", retryable, code.name)
