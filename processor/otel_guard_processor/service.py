"""The processor as a running service: receivers, forwarder, detector, metrics and their lifecycle.

:class:`Processor` builds every part from a :class:`~otel_guard_processor.config.ProcessorConfig`,
``start()`` binds every listener (an address in use fails the start, naming the option), and
``stop()`` drains: the receivers stop taking requests, the requests in flight finish -- forwarded
and acknowledged, or answered with a retryable error -- for up to ``drain_timeout`` seconds, and
then detection finishes what was acknowledged, makes the counts still waiting (``count_wait``: no
later span can change them now; those of spans still waiting for their parent too) and lets go of
the traces and delegation trees; then the metrics are pushed once more (``--metrics-forward``), and
``/metrics`` keeps serving until a scrape has read those last counts, for at most ``metrics_grace``
seconds (:meth:`Processor._last_scrape`); only then do ``/metrics`` and the downstream channel
close. The CLI calls ``stop()`` on SIGTERM and SIGINT.

Detection state lives in memory only: a SIGKILL loses the counts not yet made (those waiting on
``count_wait``, and those of spans waiting for their parent) and whatever was counted since the
last scrape or push; a restart, graceful or not, loses the traces being watched (a cycle whose
spans straddle it may go unseen); never spans, which are acknowledged only once the downstream has
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import partial

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from otel_guard_processor.bounds import DetectorLimits
from otel_guard_processor.budget_shares import split
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.detection import Detection
from otel_guard_processor.engine import EngineDetector
from otel_guard_processor.forwarder import Forwarder
from otel_guard_processor.grpc_receiver import GrpcReceiver
from otel_guard_processor.http_receiver import AsgiServer, build_http_app
from otel_guard_processor.logs import LoopLog
from otel_guard_processor.metrics import RequestStats, new_registry
from otel_guard_processor.metrics_push import MetricsPush
from otel_guard_processor.pipeline import Pipeline

__all__ = ["Processor"]

SWEEP_INTERVAL = 1.0
"""Seconds between sweeps: a waiting count is made within about this long of its due time."""


class Processor:
    """Everything one ``otel-guard processor`` runs; see the module docstring."""

    def __init__(self, config: ProcessorConfig) -> None:
        self.config = config.validate()
        # Each counted cycle gets a log line (rate-limited per label).
        self.loop_log = LoopLog()
        self.detector = EngineDetector(
            DetectorLimits(
                max_traces=config.max_traces,
                max_spans=config.max_spans,
                max_spans_per_trace=config.max_spans_per_trace,
                max_held_bytes=config.max_held_bytes,
                trace_ttl=config.trace_ttl,
                count_wait=config.count_wait,
            ),
            on_cycle=self.loop_log.counted,
            dialects=self.config.dialect_rows(),
        )
        self.stats = RequestStats()
        # The one memory budget every holder of request bytes draws from (receivers, conversion,
        # pipeline, forwarder), a share of it each receiver; detection state has its own bound
        # (max_held_bytes).
        self.budgets = split(
            config.max_pending_bytes, config.retry_after, http=config.http_listen is not None
        )
        self.budget = self.budgets.whole
        self.stats.held_bytes = lambda: self.budget.used
        self.stats.kept_room = self.budgets.kept_counts
        self.detection = Detection(self.detector, self.stats)
        self.registry = new_registry(self.detector, self.stats)
        self.forwarder: Forwarder | None = None
        self.grpc: GrpcReceiver | None = None
        self.http: AsgiServer | None = None
        self.prometheus: AsgiServer | None = None
        self.pipeline: Pipeline | None = None
        self.push: MetricsPush | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._scraped: list[float] = []  # when the last two scrapes came (monotonic)
        self._last_read = asyncio.Event()  # a scrape read the counts the drain made

    async def start(self) -> None:
        """Bind and start every listener; on any failure, stop what had started and raise."""
        config = self.config
        if config.forward is not None:
            self.forwarder = Forwarder(
                config.forward,
                timeout=config.forward_timeout,
                max_inflight=config.max_inflight,
                max_message_bytes=config.max_request_bytes,
                budget=self.budget,
            )
        self.pipeline = Pipeline(
            self.detection,
            self.stats,
            self.forwarder,
            retry_after=config.retry_after,
            budget=self.budget,
            forward_headers=config.forward_headers or (),
        )
        try:
            self.grpc = GrpcReceiver(
                self.pipeline,
                config.listen,
                config.max_request_bytes,
                read_timeout=config.read_timeout,
                retry_after=config.retry_after,
                budget=self.budgets.grpc,
                max_connection_bytes=self.budgets.max_connection_bytes,
            )
            await self.grpc.start()
            if config.http_listen is not None:
                app = build_http_app(
                    self.pipeline, config.max_request_bytes, config.read_timeout, budget=self.budgets.http
                )
                self.http = AsgiServer(
                    app,
                    config.http_listen,
                    option="http_listen",
                    what="OTLP/HTTP",
                    graceful_timeout=config.drain_timeout,
                )
                await self.http.start()
            if config.prometheus is not None:
                self.prometheus = AsgiServer(
                    self._metrics_app(),
                    config.prometheus,
                    option="prometheus",
                    what="metrics",
                    graceful_timeout=1.0,
                )
                await self.prometheus.start()
            if config.metrics_forward is not None:
                self.push = MetricsPush(
                    config.metrics_forward, config.metrics_interval, self.registry, self.detection
                )
        except BaseException:
            await self.stop()
            raise
        self._sweeper = asyncio.create_task(self._sweep())
        if self.push is not None:
            self.push.start()

    def describe(self) -> str:
        parts = [f"OTLP/gRPC on {self._where(self.config.listen, self.grpc)}"]
        if self.http is not None:
            parts.append(f"OTLP/HTTP on {self._where(self.config.http_listen, self.http)}")
        parts.append(f"forwarding to {self.config.forward}" if self.forwarder else "not forwarding")
        if self.prometheus is not None:
            parts.append(f"metrics on {self._where(self.config.prometheus, self.prometheus)}/metrics")
        if self.push is not None:
            parts.append(f"pushing metrics to {self.push.target} every {self.push.interval:g} s")
        return ", ".join(parts)

    @staticmethod
    def _where(address: str | None, server: GrpcReceiver | AsgiServer | None) -> str:
        assert address is not None
        assert server is not None
        host = address.rpartition(":")[0]
        return f"{host}:{server.port}"

    def _metrics_app(self) -> Starlette:
        from otel_guard_processor.metrics import choose_encoder

        async def metrics(request: Request) -> Response:
            # OpenMetrics (with the exemplars) when the scraper asks for it, else the plain text
            # format. In the detection queue: after every request acknowledged so far.
            encode, content_type = choose_encoder(request.headers.get("accept", ""))
            self._scraped = [*self._scraped[-1:], time.monotonic()]
            if self.grpc is not None:
                self.grpc.count_refusals()
            body = await self.detection.run(partial(encode, self.registry))
            if self.detection.stopped:
                self._last_read.set()
            return Response(body, headers={"Content-Type": content_type})

        return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            self.detection.expire(time.monotonic())
            self.loop_log.flush()
            if self.grpc is not None:
                self.grpc.count_refusals()

    async def stop(self) -> None:
        """Drain and stop; safe to call more than once."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        drain = self.config.drain_timeout
        stopping = []
        if self.grpc is not None:
            self.grpc.count_refusals()
            stopping.append(self.grpc.stop(drain))
        if self.http is not None:
            stopping.append(self.http.stop())
        await asyncio.gather(*stopping)
        self.grpc = self.http = None
        await self.detection.stop(drain)
        self.loop_log.flush(everything=True)
        if self.push is not None:
            await self.push.stop()
            self.push = None
        if self.prometheus is not None:
            await self._last_scrape()
            await self.prometheus.stop()
            self.prometheus = None
        if self.forwarder is not None:
            await self.forwarder.close()
            self.forwarder = None
        self._stopped.set()

    async def _last_scrape(self) -> None:
        """Wait until a scrape has read the drain's counts: at most ``metrics_grace`` seconds, and
        at most 1.5 times the interval seen between the last two scrapes (the scraper's own, as a
        Prometheus scrapes at a fixed interval); not at all when ``/metrics`` was never scraped
        (no scraper to wait for). A scrape that began before the drain ended reads its counts too."""
        if not self._scraped or self._last_read.is_set():
            return
        wait = self.config.metrics_grace
        if len(self._scraped) == 2:
            wait = min(wait, 1.5 * (self._scraped[1] - self._scraped[0]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._last_read.wait(), wait)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
