"""One export request, from bytes in to the answer out: parse, forward, detect, acknowledge.

Both receivers hand the pipeline the protobuf bytes of an ExportTraceServiceRequest (metrics and
logs take the same way bar parsing and detection: :meth:`Pipeline.export_unread`). The order of
work is what keeps spans safe and the clients apart:

1. take it, or refuse it with RESOURCE_EXHAUSTED and a retry delay when the processor's one memory
   budget (``max_pending_bytes``, a :class:`MemoryBudget` every holder of request bytes draws from:
   the receivers, the conversion, this, the forwarder) cannot hold it; the client keeps the spans
   and sends them again. A request is held from its first byte (the receiver's reservation is
   handed over with it) until it is both answered and detected, and while it is forwarded twice
   over: the forwarder's gRPC client holds a copy of it while it is sent. One request is always
   taken when nothing else is held;
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

from otel_guard_processor._engine import MemoryBudget, Reservation
from otel_guard_processor.detection import Detection
from otel_guard_processor.engine import DecodeError
from otel_guard_processor.forwarder import DownstreamError, Forwarder
from otel_guard_processor.headers import Headers
from otel_guard_processor.metrics import RequestStats
from otel_guard_processor.otlp import MalformedRequest
from otel_guard_processor.signals import Unread

__all__ = ["Answer", "Pipeline", "http_status"]

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
        budget: MemoryBudget,
        clock: Callable[[], float] = time.monotonic,
        forward_headers: tuple[str, ...] = (),
    ) -> None:
        self.detection = detection
        self.stats = stats
        self.forwarder = forwarder
        self.forward_headers = forward_headers  # the header names the receivers pass on
        self._retry_after = retry_after
        self.budget = budget
        self.max_pending_bytes = budget.limit
        self._clock = clock
        # Downstream failures are logged at most once per DOWNSTREAM_LOG_SECONDS per reason, with
        # how many more there were meanwhile: an outage is one line a minute, not one a request.
        self._downstream_logged: dict[str, float] = {}
        self._downstream_unlogged: dict[str, int] = {}

    async def export(
        self,
        raw: bytes,
        protocol: str,
        started: float | None = None,
        headers: Headers = (),
        held: Reservation | None = None,
    ) -> Answer:
        """Handle one request's protobuf bytes; ``started`` is when it began to arrive, ``headers``
        those forwarded with it (``--forward-headers``), ``held`` the budget its receiver holds for
        it (handed over: held here from now on)."""
        started = time.perf_counter() if started is None else started
        stats = self.stats
        stats.inflight += 1
        try:
            size = len(raw)
            forwarder = self.forwarder
            reservation = self._take(raw, held)
            if reservation is None:
                return self.busy(protocol, size, started)  # before parsing: a refusal costs next to nothing
            held_here = _Held(reservation, 0 if forwarder is None else size)
            full = None if forwarder is None else forwarder.busy()
            try:
                # Detected (or queued for it) only when it goes on downstream: a refused request
                # comes again. Detection's decode is the check that it is readable; else its check(),
                # which refuses what detection would: one answer whatever the load.
                detection = self.detection
                if full is None:
                    spans = detection.take(raw, self._clock(), held_here.release)
                else:
                    spans = detection.check(raw)
            except DecodeError as exc:
                held_here.drop()
                message = f"not an OTLP ExportTraceServiceRequest: {exc}"
                return self.refuse(protocol, "invalid", grpc.StatusCode.INVALID_ARGUMENT, message,
                                   size, started)  # fmt: skip
            if full is not None:
                held_here.drop()
                return self._downstream_failed(full, protocol, size, spans, started)
            # No await since busy() said there is room: start() cannot refuse it.
            answering = None if forwarder is None else forwarder.start(raw, headers=headers)
            stats.spans["received"] += spans
            try:
                response = b"" if answering is None else await answering
            except DownstreamError as exc:
                answering = None  # it holds the error, whose traceback holds this frame: a cycle
                stats.spans["rejected"] += spans
                stats.request(protocol, "downstream_error", size, time.perf_counter() - started)
                return self._answer_error(exc, f"{spans} spans")
            finally:
                held_here.answered()
                held_here.release()
            if answering is not None:
                stats.spans["forwarded"] += spans
            stats.request(protocol, "ok", size, time.perf_counter() - started)
            return Answer(grpc.StatusCode.OK, response=response)
        finally:
            stats.inflight -= 1

    async def export_unread(
        self,
        signal: Unread,
        raw: bytes,
        protocol: str,
        started: float,
        headers: Headers = (),
        held: Reservation | None = None,
    ) -> Answer:
        """Handle one metrics or logs request: forwarded as it came, or answered OK without
        ``--forward``; never read. The same steps as :meth:`export` bar detection: refused as busy
        past the memory budget, INVALID_ARGUMENT when it is not protobuf, acknowledged only once
        the downstream acknowledged."""
        stats = self.stats
        stats.inflight += 1
        try:
            size = len(raw)
            if self.forwarder is None:
                if held is not None:
                    held.release()  # nothing is kept: never busy
                reservation = None
            else:
                reservation = self._take(raw, held)
                if reservation is None:
                    return self.busy(protocol, size, started)
            held_here = None if reservation is None else _Held(reservation, size, holders=1)
            try:
                signal.check(raw)
            except MalformedRequest as exc:
                if held_here is not None:
                    held_here.drop()
                return self.refuse(protocol, "invalid", grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                   size, started)  # fmt: skip
            if self.forwarder is None or held_here is None:
                stats.unread(signal.name, "discarded")
                stats.request(protocol, "ok", size, time.perf_counter() - started)
                return Answer(grpc.StatusCode.OK)
            try:
                response = await self.forwarder.start(raw, signal.method, headers)
            except DownstreamError as exc:
                stats.unread(signal.name, "rejected")
                stats.request(protocol, "downstream_error", size, time.perf_counter() - started)
                return self._answer_error(exc, f"a {signal.name} request")
            finally:
                held_here.release()
            stats.unread(signal.name, "forwarded")
            stats.request(protocol, "ok", size, time.perf_counter() - started)
            return Answer(grpc.StatusCode.OK, response=response)
        finally:
            stats.inflight -= 1

    def _take(self, raw: bytes, held: Reservation | None) -> Reservation | None:
        """The budget ``raw`` holds here: its receiver's reservation (handed over) or a new one,
        made exactly its size, and its size again while it is forwarded (the gRPC client's copy);
        None (nothing held) when the budget cannot hold that now."""
        reservation = self.budget.empty() if held is None else held.hand_over()
        need = len(raw) * (1 if self.forwarder is None else 2)
        if reservation.resize(need):
            return reservation
        reservation.release()
        return None

    def busy(self, protocol: str, size: int, started: float) -> Answer:
        """Refuse a request as busy (the memory budget, ``max_pending_bytes``, is held), with the
        retry delay, and count it."""
        return self.refuse(
            protocol,
            "busy",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{self.budget.used} bytes of requests are held: being received or converted, waiting for "
            f"the downstream or for detection (max_pending_bytes {self.max_pending_bytes}); retry later",
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
    """A request's reservation of the budget, held until it is both answered and detected; the
    forwarder's copy (``copy`` bytes of it) only until it is answered."""

    __slots__ = ("_copy", "_holders", "_reservation")

    def __init__(self, reservation: Reservation, copy: int, holders: int = 2) -> None:
        self._reservation = reservation
        self._copy = copy
        self._holders = holders  # the answer and the detection, or the answer alone

    def release(self) -> None:
        """One of the two is done with it (the first to call it is the answer or the detection)."""
        self._holders -= 1
        if self._holders <= 0:
            self._reservation.release()

    def answered(self) -> None:
        """The downstream answered: its client's copy is let go of."""
        self._reservation.shrink(self._copy)
        self._copy = 0

    def drop(self) -> None:
        """The request goes no further: neither is."""
        self._holders = 0
        self._reservation.release()
