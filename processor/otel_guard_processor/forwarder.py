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
beside those in flight (at most ``SENDS``). Only requests whose forwarded headers
(``--forward-headers``) are equal are joined: a send goes under the headers of the oldest request
waiting, and the others wait for a send of their own. Each send costs
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

A request larger than the downstream takes is split (:mod:`otel_guard_processor.split`), never
retried as it was: the downstream's RESOURCE_EXHAUSTED that says so in gRPC's own words ("received
message larger than max (N vs. LIMIT)", grpc-go's, grpc-core's and tonic's) teaches the forwarder
the downstream's limit; that request, and from then on every send larger than it, goes as parts
within it, each item (span, metric, log record) in exactly one part, at once. The client gets one
answer: the parts' ``partial_success`` counts summed, or the first part's error (a permanent one
before a retryable one, so that a request that can never go is not retried for ever). An item larger
than the limit on its own is not sent: with other parts sent it is counted as rejected in the
``partial_success``, and a request of nothing else is answered with the downstream's
RESOURCE_EXHAUSTED, without a retry delay.

Memory: every byte here is in the processor's one memory budget (``max_pending_bytes``). A
request waiting here, and the gRPC client's copy of it while it is sent, are held by the pipeline
(it takes twice a request's bytes while it is forwarded), so a send never waits for budget. What
the forwarder adds is held here: the joined bytes of a send of several requests (a join the budget
cannot hold now is not made: the oldest request goes alone), and the parts of a split request (past
the budget: RESOURCE_EXHAUSTED with a retry delay). A request whose client goes away while it waits
leaves the queue at once, its bytes with it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Final

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_guard_processor._engine import MemoryBudget, Reservation
from otel_guard_processor.forward_client import CallError, EngineClient
from otel_guard_processor.headers import Headers
from otel_guard_processor.signals import LOGS, METRICS, UNREAD
from otel_guard_processor.split import split

__all__ = ["EXPORT_METHOD", "MERGE_BYTES", "METHODS", "SENDS", "DownstreamError", "Forwarder"]

_log = logging.getLogger("otel_guard_processor")

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# Every signal's Export: traces, and the metrics and logs passed on unread (signals.py).
METHODS = (EXPORT_METHOD, *(signal.method for signal in UNREAD))
_RESPONSES: dict[str, type[Message]] = {
    EXPORT_METHOD: ExportTraceServiceResponse,
    **{signal.method: signal.response for signal in UNREAD},
}

SENDS: Final = 4
"""The most sends of one signal in flight: a second one starts only once ``MERGE_BYTES`` wait."""
CLIENT = "grpcio"
"""The gRPC client a Forwarder sends with unless told: ``grpcio``, or ``engine`` (the engine's own,
a prototype that needs the cargo feature ``h2-forwarder``: :mod:`otel_guard_processor.forward_client`),
or ``tonic`` (its calls made by tonic's client: the feature ``tonic-forwarder``)."""
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
    limit: int | None = None  # the most bytes the downstream takes, where its refusal says so

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class Forwarder:
    """One gRPC channel to the downstream, with a bound on requests in flight."""

    def __init__(
        self,
        target: str,
        *,
        timeout: float,
        max_inflight: int,
        max_message_bytes: int,
        budget: MemoryBudget | None = None,
        client: str | None = None,
        gzip: bool = False,
    ) -> None:
        self.target = target
        # Alone (no budget given), its joins and parts are held in a budget of its own, unbounded.
        self._budget = budget if budget is not None else MemoryBudget(1 << 62)
        self._timeout = timeout
        self._max_inflight = max_inflight
        self._inflight = 0
        client = CLIENT if client is None else client
        if client not in ("grpcio", "engine", "tonic"):
            raise ValueError(f"client must be grpcio, engine or tonic, not {client!r}")
        self._engine = (
            None
            if client == "grpcio"
            else EngineClient(
                target,
                max_send_bytes=max_message_bytes,
                gzip=gzip,
                stack="tonic" if client == "tonic" else "h2",
            )
        )
        self._channel = (
            None
            if self._engine is not None
            else grpc.aio.insecure_channel(
                target,
                compression=grpc.Compression.Gzip if gzip else None,
                options=[
                    ("grpc.max_send_message_length", max_message_bytes),
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    # Reconnect soon after the downstream comes back: clients are retrying meanwhile.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 5000),
                ],
            )
        )
        # No (de)serializers: requests and responses pass as the bytes they are.
        channel = self._channel
        self._lanes = {
            method: _Lane(
                method,
                None
                if channel is None
                else channel.unary_unary(method, request_serializer=None, response_deserializer=None),
            )
            for method in METHODS
        }
        self._sends: set[asyncio.Task[None]] = set()  # held, so that a send is never collected
        self._closed = False
        self._limit: int | None = None  # the most bytes a send may have, once the downstream said

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def queued_bytes(self) -> int:
        """Bytes of the requests waiting to be sent, every signal's."""
        return sum(lane.waiting_bytes for lane in self._lanes.values())

    @property
    def limit(self) -> int | None:
        """The most bytes the downstream takes in a request, once it said so; None before."""
        return self._limit

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

    def start(self, raw: bytes, method: str = EXPORT_METHOD, headers: Headers = ()) -> asyncio.Future[bytes]:
        """Start sending ``raw`` to ``method`` (one of METHODS) with ``headers`` as the call's
        metadata; the future gives the downstream's response bytes, or raises DownstreamError.

        Raises DownstreamError at once when ``max_inflight`` requests are already waiting (what
        :meth:`busy` says beforehand). The pipeline starts it once the request has been read: a
        request that does not decode is never forwarded.
        """
        busy = self.busy()
        if busy is not None:
            raise busy
        self._inflight += 1
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        lane = self._lanes[method]
        waiting = _Waiting(raw, answer, headers)
        lane.waiting.append(waiting)
        lane.waiting_bytes += len(raw)
        answer.add_done_callback(partial(self._answered, lane, waiting))
        if self._closed:
            self._fail_waiting(lane)
        else:
            self._pump(lane)
        return answer

    def _answered(self, lane: _Lane, waiting: _Waiting, answer: asyncio.Future[bytes]) -> None:
        # If the client went away nobody awaits the answer: retrieve it anyway, so a failure is
        # not reported as an exception never retrieved.
        if not answer.cancelled():
            answer.exception()
        # A client gone away while its request waits (the answer cancelled) takes its bytes along.
        if waiting.queued:  # else taken to be sent (or failed) already: counted there
            waiting.queued = False
            lane.waiting.remove(waiting)  # at most max_inflight to look through
            lane.waiting_bytes -= len(waiting.raw)
            self._inflight -= 1

    def _merge_bytes(self) -> int:
        return MERGE_BYTES if self._limit is None else min(MERGE_BYTES, self._limit)

    def _pump(self, lane: _Lane) -> None:
        """Send what waits when nothing is in flight, or a full send beside those that are."""
        merge = self._merge_bytes()
        while lane.waiting and (not lane.sending or (lane.waiting_bytes >= merge and lane.sending < SENDS)):
            if not self._send_next(lane):
                # The budget holds no join now: each request goes alone (its send is held already),
                # rather than one at a time behind a slow downstream.
                while lane.waiting:
                    self._send_next(lane)
                return

    def _send_next(self, lane: _Lane) -> bool:
        """Send what waits in ``lane``: the oldest request, and those after it while they fit in
        MERGE_BYTES (or the downstream's limit, if smaller) and the budget holds their join; a
        request whose client went away is dropped. False when others waited and the budget held
        no join (the oldest went alone)."""
        group: list[tuple[bytes, asyncio.Future[bytes]]] = []
        size = 0
        merge = self._merge_bytes()
        joinable = len(lane.waiting) > 1
        joined = self._hold(min(merge, lane.waiting_bytes)) if joinable else None
        if joined is None:
            merge = 0  # the oldest alone: its send is held already
        waiting = lane.waiting
        headers = waiting[0].headers if waiting else ()
        others: list[_Waiting] = []  # of other headers: they stay, in their order
        while waiting:
            first = waiting[0]
            raw, answer = first.raw, first.answer
            if first.headers != headers:
                others.append(waiting.popleft())
                continue
            if group and size + len(raw) > merge:
                break
            waiting.popleft()
            first.queued = False
            lane.waiting_bytes -= len(raw)
            if answer.done():  # cancelled: its client is gone and will send it again
                self._inflight -= 1
                continue
            group.append((raw, answer))
            size += len(raw)
        if others:
            waiting.extendleft(reversed(others))
        if joined is not None:
            joined.resize(size if len(group) > 1 else 0)  # only shrinks
        if group:
            lane.sending += 1
            sending = asyncio.get_running_loop().create_task(self._send(lane, group, headers, joined))
            self._sends.add(sending)
            sending.add_done_callback(self._sends.discard)
        elif joined is not None:
            joined.release()
        return joined is not None or not joinable

    def _hold(self, size: int, *, finishing: bool = False) -> Reservation | None:
        """``size`` bytes of the budget for a copy the forwarder makes, or None when it cannot.
        A join leaves free the room kept for a refused request (it is optional: each request can
        go alone); ``finishing`` (a request's parts) may use it, since refusing them wastes a
        request already taken."""
        return self._budget.reserve(size, finishing=finishing)

    async def _send(
        self,
        lane: _Lane,
        group: list[tuple[bytes, asyncio.Future[bytes]]],
        headers: Headers = (),
        joined: Reservation | None = None,
    ) -> None:
        try:
            raw = group[0][0] if len(group) == 1 else b"".join(raw for raw, _ in group)
            try:
                response = await self._deliver(lane, raw, headers)
            except DownstreamError as error:
                if len(group) > 1 and not error.retryable:
                    # Perhaps one request's fault: each is sent alone and gets its own answer.
                    del raw
                    if joined is not None:
                        joined.release()
                    await asyncio.gather(*(self._send_alone(lane, item, headers) for item in group))
                else:
                    _answer_all(group, error)
            else:
                if len(group) > 1 and response:
                    response = _shared(lane.method, response, len(group))
                for _, answer in group:
                    if not answer.done():
                        answer.set_result(response)
        finally:
            if joined is not None:
                joined.release()
            self._inflight -= len(group)
            lane.sending -= 1
            if not self._closed:
                self._pump(lane)

    async def _send_alone(
        self, lane: _Lane, item: tuple[bytes, asyncio.Future[bytes]], headers: Headers = ()
    ) -> None:
        raw, answer = item
        try:
            response = await self._deliver(lane, raw, headers)
        except DownstreamError as error:
            _answer_all([item], error)
        else:
            if not answer.done():
                answer.set_result(response)

    async def _deliver(self, lane: _Lane, raw: bytes, headers: Headers = ()) -> bytes:
        """Send ``raw`` whole, or split to the downstream's limit: as it is when it fits (or the
        limit is not known), else, or when the downstream says it is too large, in parts."""
        limit = self._limit
        if limit is None or len(raw) <= limit:
            try:
                return await self._call(lane, raw, headers)
            except DownstreamError as error:
                if error.limit is None or error.limit >= len(raw):
                    raise
                limit = self._learn(error.limit)
        return await self._send_parts(lane, raw, limit, headers)

    def _learn(self, limit: int) -> int:
        """The downstream takes at most ``limit`` bytes (its refusal said so): the limit now."""
        if self._limit is None or limit < self._limit:
            self._limit = limit
            _log.warning(
                "otel-guard processor: the downstream %s takes requests of at most %d bytes; "
                "larger ones are sent to it in parts",
                self.target,
                limit,
            )
        return self._limit

    async def _send_parts(self, lane: _Lane, raw: bytes, limit: int, headers: Headers = ()) -> bytes:
        """Send ``raw`` as parts of at most ``limit`` bytes (held in the budget while they are
        sent); the answer of them all."""
        held = self._hold(len(raw), finishing=True)
        if held is None:
            raise DownstreamError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the processor holds as many bytes of requests as it may (max_pending_bytes), and a "
                f"request of {len(raw)} bytes must be split to the {limit} bytes the downstream "
                f"{self.target} takes; retry later",
                retryable=True,
                reason="busy",
            )
        with held:
            return await self._send_cut(lane, raw, limit, headers)

    async def _send_cut(self, lane: _Lane, raw: bytes, limit: int, headers: Headers) -> bytes:
        try:
            cut = split(raw, limit)
        except ValueError as exc:
            raise self._too_large(len(raw), limit, f"it cannot be split: {exc}") from None
        if not cut.parts:
            what = _ITEMS[lane.method][1]
            raise self._too_large(len(raw), limit, f"it holds nothing but {what} larger than that")
        answers = await asyncio.gather(
            *(self._deliver(lane, part, headers) for part in cut.parts), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, DownstreamError):
                raise answer
        errors = [answer for answer in answers if isinstance(answer, DownstreamError)]
        if errors:
            raise next((error for error in errors if not error.retryable), errors[0])
        return _combined(lane.method, [answer for answer in answers if isinstance(answer, bytes)],
                         len(cut.too_large), limit)  # fmt: skip

    def _too_large(self, size: int, limit: int, why: str) -> DownstreamError:
        return DownstreamError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the downstream {self.target} takes requests of at most {limit} bytes; this one, of {size} "
            f"bytes, was not sent: {why}",
            retryable=False,
            reason="RESOURCE_EXHAUSTED",
            limit=limit,
        )

    async def _call(self, lane: _Lane, raw: bytes, headers: Headers = ()) -> bytes:
        try:
            if lane.export is None:
                assert self._engine is not None  # the lanes have no grpcio method only then
                return await self._engine.call(lane.method, raw, timeout=self._timeout, metadata=headers)
            response: bytes = await lane.export(raw, timeout=self._timeout, metadata=headers or None)
            return response
        except grpc.aio.AioRpcError as exc:
            raise _downstream_error(exc.code(), exc.details(), self.target, self._timeout) from None
        except CallError as exc:
            raise _downstream_error(exc.code, exc.details, self.target, self._timeout) from None
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
            waiting = lane.waiting.popleft()
            waiting.queued = False
            lane.waiting_bytes -= len(waiting.raw)
            self._inflight -= 1
            if not waiting.answer.done():
                waiting.answer.set_exception(error)

    async def close(self) -> None:
        """Answer what still waits as unavailable (its clients retry), end the sends in flight."""
        self._closed = True
        for lane in self._lanes.values():
            self._fail_waiting(lane)
        if self._channel is not None:
            await self._channel.close(grace=None)
        if self._engine is not None:
            await self._engine.close()
        if self._sends:
            await asyncio.gather(*self._sends, return_exceptions=True)


class _Lane:
    """One signal's Export: the sends in flight and the requests waiting to go as one."""

    __slots__ = ("export", "method", "sending", "waiting", "waiting_bytes")

    def __init__(self, method: str, export: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] | None) -> None:
        self.method = method
        self.export = export
        self.sending = 0
        self.waiting: deque[_Waiting] = deque()
        self.waiting_bytes = 0


class _Waiting:
    """A request waiting in a lane (``queued`` until it is taken to be sent, or leaves)."""

    __slots__ = ("answer", "headers", "queued", "raw")

    def __init__(self, raw: bytes, answer: asyncio.Future[bytes], headers: Headers = ()) -> None:
        self.raw = raw
        self.answer = answer
        self.headers = headers  # forwarded with it: joined only with requests of equal ones
        self.queued = True


# Per method: the field of its partial_success that counts what was rejected, and what it counts.
_ITEMS: dict[str, tuple[str, str]] = {
    EXPORT_METHOD: ("rejected_spans", "spans"),
    METRICS.method: ("rejected_data_points", "metrics"),
    LOGS.method: ("rejected_log_records", "log records"),
}


def _combined(method: str, responses: list[bytes], too_large: int, limit: int) -> bytes:
    """The downstream's answers to the parts of one request as one answer: their ``partial_success``
    counts summed, their messages joined, and the items too large to send counted as rejected."""
    if not too_large and not any(responses):
        return responses[0]
    kind = _RESPONSES[method]
    field, what = _ITEMS[method]
    combined = kind()
    rejected = 0
    messages = []
    for response in responses:
        try:
            message = kind.FromString(response)
        except DecodeError:
            continue  # not ours to read
        if message.HasField("partial_success"):
            partial_success = message.partial_success  # type: ignore[attr-defined]
            rejected += getattr(partial_success, field)
            if partial_success.error_message:
                messages.append(partial_success.error_message)
    if too_large:
        rejected += too_large  # an item each, as this processor cannot count inside one it does not read
        messages.append(
            f"{too_large} {what} larger than the {limit} bytes the downstream takes were not sent"
        )
    if not rejected and not messages:
        return responses[0]
    partial_success = combined.partial_success  # type: ignore[attr-defined]
    setattr(partial_success, field, rejected)
    partial_success.error_message = "; ".join(messages)[:1024]
    return combined.SerializeToString()


def _answer_all(group: list[tuple[bytes, asyncio.Future[bytes]]], error: DownstreamError) -> None:
    """Fail the answers of ``group`` not answered yet with ``error``, its traceback cut first: it
    holds the frames it passed, whose locals hold ``group`` and so the answers that hold it, a
    cycle that would keep the request's bytes past their budget until the collector ran."""
    error = error.with_traceback(None)
    for _, answer in group:
        if not answer.done():
            answer.set_exception(error)


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


def _downstream_error(
    code: grpc.StatusCode, details: str | None, target: str, timeout: float
) -> DownstreamError:
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
            f"the downstream {target} is unavailable: {details}",
            retryable=True,
            reason=code.name,
        )
    details = details or ""
    retryable = code == grpc.StatusCode.RESOURCE_EXHAUSTED
    limit = None
    if retryable:
        too_large = _TOO_LARGE.search(details)
        limit = int(too_large.group("limit") or too_large.group("tonic")) if too_large else None
    return DownstreamError(code, f"the downstream {target} answered: {details}", retryable, code.name, limit)


# How gRPC servers refuse a message over their limit: grpc-go ("grpc: received message larger than
# max (5242885 vs. 4194304)", the Collector's), grpc-core ("Received message larger than max (...)")
# and tonic ("decoded message length too large: found 5242885 bytes, the limit is: 4194304 bytes").
_TOO_LARGE = re.compile(
    r"larger than max \(\d+ vs\. (?P<limit>\d+)\)|found \d+ bytes, the limit is: (?P<tonic>\d+) bytes",
    re.IGNORECASE,
)
