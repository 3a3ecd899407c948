"""One export request, from bytes in to the answer out: parse, forward, detect, acknowledge.

Both receivers hand the pipeline the protobuf bytes of an ExportTraceServiceRequest. The order of
work is what keeps spans safe and the downstream busy:

1. parse (a request that does not parse is answered INVALID_ARGUMENT and changes nothing),
2. start forwarding the very same bytes, so the downstream works while this process detects,
3. detect (an unexpected failure here is logged and counted; it never costs the client its spans),
4. wait for the downstream's acknowledgement and answer the client with it -- or with a retryable
   error, so the client keeps the spans and sends them again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from otel_guard_processor.detector import Detector
from otel_guard_processor.forwarder import DownstreamError, Forwarder
from otel_guard_processor.metrics import RequestStats
from otel_guard_processor.otlp import MalformedRequest, RequestView, parse_request

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
        detector: Detector,
        stats: RequestStats,
        forwarder: Forwarder | None,
        *,
        retry_after: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.detector = detector
        self.stats = stats
        self.forwarder = forwarder
        self._retry_after = retry_after
        self._clock = clock
        self._detection_failed_once = False
        # Downstream failures are logged at most once per DOWNSTREAM_LOG_SECONDS per reason, with
        # how many more there were meanwhile: an outage is one line a minute, not one a request.
        self._downstream_logged: dict[str, float] = {}
        self._downstream_unlogged: dict[str, int] = {}

    async def export(self, raw: bytes, protocol: str, started: float | None = None) -> Answer:
        """Handle one request's protobuf bytes; ``started`` is when it began to arrive."""
        started = time.perf_counter() if started is None else started
        stats = self.stats
        stats.inflight += 1
        try:
            try:
                request = parse_request(raw)
            except MalformedRequest as exc:
                return self.refuse(protocol, "invalid", grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                   len(raw), started)  # fmt: skip
            pending = None
            if self.forwarder is not None:
                try:
                    pending = self.forwarder.start(raw)
                except DownstreamError as exc:
                    return self._downstream_failed(exc, protocol, raw, request, started)
                # Let the call go out before detection keeps this loop busy.
                await asyncio.sleep(0)
            try:
                spans = self.detector.ingest(request, raw, self._clock())
            except Exception:
                spans = _count_spans(request)
                stats.detection_errors += 1
                if not self._detection_failed_once:
                    self._detection_failed_once = True
                    _log.exception("otel-guard processor: detection failed; spans still forwarded")
            stats.spans["received"] += spans
            response = b""
            if pending is not None:
                try:
                    response = await pending
                except DownstreamError as exc:
                    stats.spans["rejected"] += spans
                    stats.request(protocol, "downstream_error", len(raw), time.perf_counter() - started)
                    return self._answer_error(exc, spans)
                stats.spans["forwarded"] += spans
            stats.request(protocol, "ok", len(raw), time.perf_counter() - started)
            return Answer(grpc.StatusCode.OK, response=response)
        finally:
            stats.inflight -= 1

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
        self, exc: DownstreamError, protocol: str, raw: bytes, request: RequestView, started: float
    ) -> Answer:
        stats = self.stats
        spans = _count_spans(request)
        stats.spans["received"] += spans
        stats.spans["rejected"] += spans
        stats.request(protocol, "downstream_error", len(raw), time.perf_counter() - started)
        return self._answer_error(exc, spans)

    def _answer_error(self, exc: DownstreamError, spans: int) -> Answer:
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
                "otel-guard processor: forwarding to %s failed (%s): %s; %d spans handed back to the "
                "client%s%s",
                target,
                reason,
                exc.details[:200],
                spans,
                " to retry" if exc.retryable else "",
                f"; {more} more such failures since the last report" if more else "",
            )
        else:
            self._downstream_unlogged[reason] = self._downstream_unlogged.get(reason, 0) + 1
        return Answer(exc.code, exc.details, retry_after=self._retry_after if exc.retryable else None)


def _count_spans(request: RequestView) -> int:
    count = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            count += len(scope_spans.spans)
    return count
