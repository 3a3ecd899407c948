"""Detection behind the answers, so that no client waits for another client's spans.

The pipeline hands each request (its bytes) over and answers the client as soon as the downstream
has the spans; one consumer task hands the queued requests to the compiled engine, one call a
request, in the order they were accepted. When nothing is queued or running and the request is
small it is detected at once instead, its decode doubling as the check that it is readable (a
second decode cost 5-10% of the processor's CPU a span). The engine releases the interpreter lock
while it works, so a request of more than ``INLINE_BYTES`` is detected on one worker thread while
the event loop goes on receiving, forwarding and answering; a smaller one is detected on the loop
itself, where it takes less time than the hand-over to a thread would
(``bench/processor_throughput.py``).

Order. Everything that reads or changes the detector goes through the same queue (a request
detected at once is one that would have been the queue's next job): the sweep
(:meth:`Detection.expire`) and the Prometheus collection (:meth:`Detection.run`), so that a scrape
sees one consistent state that counts every request acknowledged before the scrape began. The
worker thread is never running while anything else touches the detector: the consumer waits for it.

The bound on what waits is the pipeline's (``max_pending_bytes``, :mod:`otel_guard_processor.pipeline`):
each request is held, in bytes, until it is both answered and detected.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from otel_guard_processor.engine import DecodeError, EngineDetector
from otel_guard_processor.metrics import RequestStats

__all__ = ["INLINE_BYTES", "Detection"]

_log = logging.getLogger("otel_guard_processor")
T = TypeVar("T")

INLINE_BYTES: Final = 1 << 20
"""Requests up to this size are detected on the event loop (a few milliseconds at most), larger
ones on the worker thread."""
_YIELD_AFTER: Final = 0.002
"""Seconds of back-to-back jobs on the loop after which the consumer gives the event loop back."""

# A job: ("ingest", raw, now, done) | ("expire", now) | ("run", work, future)
_Job = tuple[Any, ...]


class Detection:
    """One detector, fed and read through one queue; see the module docstring."""

    def __init__(
        self,
        detector: EngineDetector,
        stats: RequestStats,
        *,
        inline_bytes: int = INLINE_BYTES,
    ) -> None:
        self.detector = detector
        self._stats = stats
        self._inline_bytes = inline_bytes
        self._worker: ThreadPoolExecutor | None = None  # started with the first large request
        self._jobs: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._consumer: asyncio.Task[None] | None = None  # started with the first job
        self._expiry_queued = False
        self._running = False  # the consumer is on a job (it may be awaiting it)
        self._failed_once = False
        self._stopping = False
        self._stopped = asyncio.Event()  # set once stop() has made the last counts

    def take(self, raw: bytes, now: float, done: Callable[[], None]) -> int:
        """Detect the request ``raw`` (received at ``now``) after those before it and return its
        spans: at once when no job waits or runs and it is small (one decode does both), else
        checked with the detector's ``check`` (it decodes as the detector's
        ``ingest`` does: one answer whatever the load) and queued. Raises :class:`DecodeError`
        when it does not decode (nothing changed, ``done`` never called); else ``done()`` is
        called once it has been detected (or detection failed)."""
        if self._running or self._jobs or self._stopping or len(raw) > self._inline_bytes:
            spans: int = self.detector.check(raw)  # refuses what ingest would, whatever the load
            self.submit(raw, now, done)
            return spans
        try:
            spans = self.detector.ingest(raw, now)
        except DecodeError:
            raise
        except Exception:
            self._failed()
            spans = self.detector.check(raw)  # the count for the metrics
        done()
        return spans

    def check(self, raw: bytes) -> int:
        """The spans of ``raw``, or the :class:`DecodeError` the detector's ingest would raise."""
        return self.detector.check(raw)

    def submit(self, raw: bytes, now: float, done: Callable[[], None]) -> None:
        """Detect the request ``raw`` (its protobuf bytes, received at ``now``) after those before
        it; ``done()`` is called once it has been (or has failed)."""
        self._put(("ingest", raw, now, done))

    def expire(self, now: float) -> None:
        """Evict idle traces and make the counts whose wait is over, unless a sweep is still
        waiting its turn."""
        if not self._expiry_queued and not self._stopping:
            self._expiry_queued = True
            self._put(("expire", now))

    async def run(self, work: Callable[[], T | Awaitable[T]]) -> T:
        """``work()`` in the queue, after everything submitted before it; its result (awaited, when
        it is awaitable: the queue waits for it) or its exception. Asked while detection stops,
        ``work()`` runs once it has stopped (then nothing changes any more): a scrape during the
        drain reads the final counts."""
        if self._stopping:
            await self._stopped.wait()
            result = work()
            return await result if inspect.isawaitable(result) else result
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._put(("run", work, future))
        return await future

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` has made the last counts (nothing changes any more)."""
        return self._stopped.is_set()

    async def settled(self) -> None:
        """Return once every request submitted so far has been detected."""
        await self.run(_nothing)

    async def stop(self, timeout: float) -> None:
        """Detect what was submitted (for up to ``timeout`` seconds), end the consumer, then make
        every count still waiting -- those waiting on ``count_wait`` and those of spans still waiting
        for their parent or linked span (no later span can change them now) -- and let go of the
        traces and delegation trees held (each tree observed in ``otel_guard_tree_hops``)."""
        self._stopping = True
        consumer = self._consumer
        if consumer is not None:
            if self._jobs:
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._put(("run", _nothing, future))
                try:
                    await asyncio.wait_for(future, timeout)
                except TimeoutError:
                    _log.warning(
                        "otel-guard processor: stopped with %d requests not yet detected",
                        sum(job[0] == "ingest" for job in self._jobs),
                    )
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            self._consumer = None
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # a cancelled consumer may have left it working
            self._worker = None
        # Nothing else reads or changes the detector now.
        try:
            self.detector.drain()
        except Exception:
            _log.exception("otel-guard processor: the last counts at stop failed")
        self._stopped.set()

    # -- the consumer ----------------------------------------------------------------------------

    def _put(self, job: _Job) -> None:
        self._jobs.append(job)
        if self._consumer is None:
            self._consumer = asyncio.get_running_loop().create_task(self._consume())
        self._wake.set()

    async def _consume(self) -> None:
        jobs = self._jobs
        since = time.perf_counter()
        while True:
            if not jobs:
                self._wake.clear()
                await self._wake.wait()
                since = time.perf_counter()
            job = jobs.popleft()
            kind = job[0]
            self._running = True  # take() queues behind it
            try:
                if kind == "ingest":
                    await self._ingest(job[1], job[2], job[3])
                elif kind == "expire":
                    self._expire(job[1])
                else:
                    await self._run(job[1], job[2])
            finally:
                self._running = False
            now = time.perf_counter()
            if now - since >= _YIELD_AFTER:
                await asyncio.sleep(0)  # many jobs in a row: let the loop serve the clients
                since = time.perf_counter()

    async def _ingest(self, raw: bytes, now: float, done: Callable[[], None]) -> None:
        try:
            if len(raw) <= self._inline_bytes:
                self.detector.ingest(raw, now)
            else:
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(1, thread_name_prefix="otel-guard-detection")
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._worker, self.detector.ingest, raw, now)
        except Exception:
            self._failed()
        finally:
            done()

    def _failed(self) -> None:
        """Count a failed ingest (logged the first time, from within its ``except``)."""
        self._stats.detection_errors += 1
        if not self._failed_once:
            self._failed_once = True
            _log.exception("otel-guard processor: detection failed; spans still forwarded")

    def _expire(self, now: float) -> None:
        self._expiry_queued = False
        try:
            self.detector.expire(now)
        except Exception:
            _log.exception("otel-guard processor: the sweep of detection state failed")

    @staticmethod
    async def _run(work: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        try:
            result = work()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():  # the caller may have given up (cancelled) meanwhile
                future.set_result(result)


def _nothing() -> None:
    return None
