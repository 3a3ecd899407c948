"""One export request, from bytes in to the answer out: parse, forward, detect, acknowledge.

Both receivers hand the pipeline the protobuf bytes of an ExportTraceServiceRequest (metrics and
logs take the same way bar parsing and detection: :meth:`Pipeline.export_unread`). The order of
work is what keeps spans safe and the clients apart:

1. take it, or refuse it with RESOURCE_EXHAUSTED and a retry delay when the requests held already
   fill ``max_pending_bytes`` (a request is held, in bytes, from here until it is both answered and
   detected; one request is always taken when none is held); the client keeps the spans and sends
   them again. A receiver's bytes before this step (a body inflating or converting from OTLP/JSON)
   are held too (:meth:`Pipeline.hold`);
2. hand it to detection (:meth:`Detection.take <otel_guard_processor.detection.Detection.take>`):
   detected at once when nothing waits for detection and it is small, else checked with the engine's
   decoder as detection decodes (one answer whatever the load) and queued (decoded again when its
   turn comes: cheaper than holding what was read). Either way a request that does not decode is
   answered INVALID_ARGUMENT, saying at which byte and why, and changes nothing; with
   ``max_inflight`` requests already waiting for the downstream it is only checked and counted, and
   refused as busy;
3. forward the very same bytes;
4. wait for the downstream's acknowledgement and answer the client with it -- or with a retryable
   error, so the client keeps the spans and sends them again. The answer does not wait for
   detection: one client's large request never holds up another's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from otel_guard_processor.detection import Detection
from otel_guard_processor.engine import DecodeError
from otel_guard_processor.forwarder import DownstreamError, Forwarder
from otel_guard_processor.headers import Headers
from otel_guard_processor.metrics import RequestStats
from otel_guard_processor.otlp import MalformedRequest
from otel_guard_processor.signals import Unread

__all__ = ["Answer", "Holding", "Pipeline", "http_status"]

_log = logging.getLogger("otel_guard_processor")
DOWNSTREAM_LOG_SECONDS = 60.0

_HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    """The OTLP/HTTP status for a gRPC status (429, 502, 503 and 504 are the retryable ones)."""
    return _HTTP_STATUS.get(code, 500)


@dataclass(frozen=True)
class Answer:
    """What to tell the client: OK with the response bytes, or an error status."""

    code: grpc.StatusCode
    message: str = ""
    response: bytes = b""  # an ExportTraceServiceResponse, on OK
    retry_after: float | None = None  # seconds, on a retryable error


class Pipeline:
    """Handles export requests for every receiver; see the module docstring."""

    def __init__(
        self,
        detection: Detection,
        stats: RequestStats,
        forwarder: Forwarder | None,
        *,
        retry_after: float,
        max_pending_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        forward_headers: tuple[str, ...] = (),
    ) -> None:
        self.detection = detection
        self.stats = stats
        self.forwarder = forwarder
        self.forward_headers = forward_headers  # the header names the receivers pass on
        self._retry_after = retry_after
        self.max_pending_bytes = max_pending_bytes
        self._clock = clock
        # Downstream failures are logged at most once per DOWNSTREAM_LOG_SECONDS per reason, with
        # how many more there were meanwhile: an outage is one line a minute, not one a request.
        self._downstream_logged: dict[str, float] = {}
        self._downstream_unlogged: dict[str, int] = {}

    async def export(
        self, raw: bytes, protocol: str, started: float | None = None, headers: Headers = ()
    ) -> Answer:
        """Handle one request's protobuf bytes; ``started`` is when it began to arrive, ``headers``
        those forwarded with it (``--forward-headers``)."""
        started = time.perf_counter() if started is None else started
        stats = self.stats
        stats.inflight += 1
        try:
            size = len(raw)
            busy = self._busy(protocol, size, started)
            if busy is not None:
                return busy  # before parsing: a refusal under load costs next to nothing
            held = _Held(stats, size)
            forwarder = self.forwarder
            full = None if forwarder is None else forwarder.busy()
            try:
                # Detected (or queued for it) only when it goes on downstream: a refused request
                # comes again. Detection's decode is the check that it is readable; else its check(),
                # which refuses what detection would: one answer whatever the load.
                take = self.detection.take
                spans = take(raw, self._clock(), held.release) if full is None else self.detection.check(raw)
            except DecodeError as exc:
                held.drop()
                message = f"not an OTLP ExportTraceServiceRequest: {exc}"
                return self.refuse(protocol, "invalid", grpc.StatusCode.INVALID_ARGUMENT, message,
                                   size, started)  # fmt: skip
            if full is not None:
                held.drop()
                return self._downstream_failed(full, protocol, size, spans, started)
            # No await since busy() said there is room: start() cannot refuse it.
            answering = None if forwarder is None else forwarder.start(raw, headers=headers)
            stats.spans["received"] += spans
            try:
                response = b"" if answering is None else await answering
            except DownstreamError as exc:
                stats.spans["rejected"] += spans
                stats.request(protocol, "downstream_error", size, time.perf_counter() - started)
                return self._answer_error(exc, f"{spans} spans")
            finally:
                held.release()
            if answering is not None:
                stats.spans["forwarded"] += spans
            stats.request(protocol, "ok", size, time.perf_counter() - started)
            return Answer(grpc.StatusCode.OK, response=response)
        finally:
            stats.inflight -= 1

    async def export_unread(
        self, signal: Unread, raw: bytes, protocol: str, started: float, headers: Headers = ()
    ) -> Answer:
        """Handle one metrics or logs request: forwarded as it came, or answered OK without
        ``--forward``; never read. The same steps as :meth:`export` bar detection: refused as busy
        past ``max_pending_bytes``, INVALID_ARGUMENT when it is not protobuf, acknowledged only once
        the downstream acknowledged."""
        stats = self.stats
        stats.inflight += 1
        try:
            size = len(raw)
            busy = None if self.forwarder is None else self._busy(protocol, size, started)
            if busy is not None:
                return busy  # without a downstream nothing is held: never busy
            try:
                signal.check(raw)
            except MalformedRequest as exc:
                return self.refuse(protocol, "invalid", grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                   size, started)  # fmt: skip
            if self.forwarder is None:
                stats.unread(signal.name, "discarded")
                stats.request(protocol, "ok", size, time.perf_counter() - started)
                return Answer(grpc.StatusCode.OK)
            held = _Held(stats, size, holders=1)  # nothing to detect: held until answered
            try:
                response = await self.forwarder.start(raw, signal.method, headers)
            except DownstreamError as exc:
                stats.unread(signal.name, "rejected")
                stats.request(protocol, "downstream_error", size, time.perf_counter() - started)
                return self._answer_error(exc, f"a {signal.name} request")
            finally:
                held.release()
            stats.unread(signal.name, "forwarded")
            stats.request(protocol, "ok", size, time.perf_counter() - started)
            return Answer(grpc.StatusCode.OK, response=response)
        finally:
            stats.inflight -= 1

    def hold(self, protocol: str, size: int, started: float) -> Answer | Holding:
        """Count ``size`` bytes a receiver holds for a request before it reaches :meth:`export` (a
        body being inflated or converted) in ``max_pending_bytes`` as a request's are, until
        :meth:`Holding.release`; or the busy refusal when the requests held already fill it."""
        busy = self._busy(protocol, size, started)
        return busy if busy is not None else Holding(self, size)

    def _busy(self, protocol: str, size: int, started: float) -> Answer | None:
        """The refusal of a request of ``size`` bytes when the requests held already fill
        ``max_pending_bytes`` (one is always taken when none is held), else None."""
        pending = self.stats.pending_bytes
        if not pending or pending + size <= self.max_pending_bytes:
            return None
        return self.busy(protocol, size, started)

    def busy(self, protocol: str, size: int, started: float) -> Answer:
        """Refuse a request as busy (``max_pending_bytes`` held), with the retry delay, and count it."""
        pending = self.stats.pending_bytes
        return self.refuse(
            protocol,
            "busy",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{pending} bytes of requests are waiting for the downstream or for detection "
            f"(max_pending_bytes {self.max_pending_bytes}); retry later",
            size,
            started,
            retryable=True,
        )

    def refuse(
        self,
        protocol: str,
        outcome: str,
        code: grpc.StatusCode,
        message: str,
        size: int,
        started: float,
        retryable: bool = False,
    ) -> Answer:
        """Answer a request that is refused before it reaches detection, and count it."""
        self.stats.request(protocol, outcome, size, time.perf_counter() - started)
        return Answer(code, message, retry_after=self._retry_after if retryable else None)

    def _downstream_failed(
        self, exc: DownstreamError, protocol: str, size: int, spans: int, started: float
    ) -> Answer:
        stats = self.stats
        stats.spans["received"] += spans
        stats.spans["rejected"] += spans
        stats.request(protocol, "downstream_error", size, time.perf_counter() - started)
        return self._answer_error(exc, f"{spans} spans")

    def _answer_error(self, exc: DownstreamError, what: str) -> Answer:
        """Count and log a downstream failure; the client's answer (retryable where it is)."""
        reason = exc.reason
        self.stats.downstream_errors[reason] = self.stats.downstream_errors.get(reason, 0) + 1
        now = self._clock()
        last = self._downstream_logged.get(reason)
        if last is None or now - last >= DOWNSTREAM_LOG_SECONDS:
            more = self._downstream_unlogged.pop(reason, 0)
            self._downstream_logged[reason] = now
            target = self.forwarder.target if self.forwarder is not None else "the downstream"
            _log.warning(
                "otel-guard processor: forwarding to %s failed (%s): %s; %s handed back to the client%s%s",
                target,
                reason,
                exc.details[:200],
                what,
                " to retry" if exc.retryable else "",
                f"; {more} more such failures since the last report" if more else "",
            )
        else:
            self._downstream_unlogged[reason] = self._downstream_unlogged.get(reason, 0) + 1
        return Answer(exc.code, exc.details, retry_after=self._retry_after if exc.retryable else None)


class _Held:
    """A request's bytes, counted in ``stats.pending_bytes`` until it is both answered and detected."""

    __slots__ = ("_holders", "_size", "_stats")

    def __init__(self, stats: RequestStats, size: int, holders: int = 2) -> None:
        self._stats = stats
        self._size = size
        self._holders = holders  # the answer and the detection, or the answer alone
        stats.pending_bytes += size

    def release(self) -> None:
        """One of the two is done with it."""
        self._holders -= 1
        if self._holders == 0:
            self._stats.pending_bytes -= self._size

    def drop(self) -> None:
        """The request goes no further: neither is."""
        self._holders = 1
        self.release()


class Holding:
    """Bytes a receiver holds for a request before :meth:`Pipeline.export` takes it (a gzip body
    and what it inflates to, an OTLP/JSON body in conversion), counted in ``stats.pending_bytes``
    until released."""

    __slots__ = ("_pipeline", "_size")

    def __init__(self, pipeline: Pipeline, size: int) -> None:
        self._pipeline = pipeline
        self._size = size
        pipeline.stats.pending_bytes += size

    def grow(self, more: int) -> bool:
        """Count ``more`` bytes, or False (nothing counted) when that passes ``max_pending_bytes``
        while others hold bytes too."""
        stats = self._pipeline.stats
        pending = stats.pending_bytes
        if pending > self._size and pending + more > self._pipeline.max_pending_bytes:
            return False
        stats.pending_bytes += more
        self._size += more
        return True

    def release(self) -> None:
        """The receiver is done with them (the request went on to :meth:`Pipeline.export`, or not)."""
        self._pipeline.stats.pending_bytes -= self._size
        self._size = 0
