"""Detection behind the answers, in slices, so that no client waits for another client's spans.

Detection is pure Python and takes time in proportion to a request's spans (a few microseconds a
span: a 250,000-span request takes most of a second). It used to run inside each request's handler,
which held every other client for that long, and each acknowledgement waited for it. Here the
pipeline queues each parsed request and answers the client as soon as the downstream has the spans;
one consumer task detects the queued requests in the order they were accepted, in slices of
``SPANS_PER_STEP`` spans, and gives the event loop back between slices, so a small request is
received, forwarded and answered while a large one is being detected.

Why a task on the event loop and not a thread: a thread would run the same Python under the same
interpreter lock, and handing the lock back and forth with the event loop cost a quarter of the
throughput when measured (``bench/processor_throughput.py``); slices cost next to nothing.

Order. Everything that reads or changes the detector goes through the same queue: the sweep
(:meth:`Detection.expire`) and the Prometheus collection (:meth:`Detection.run`), so that a scrape
sees one consistent state that counts every request acknowledged before the scrape began.

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
from typing import Any, Final, TypeVar

from otel_guard_processor.detector import Detector
from otel_guard_processor.metrics import RequestStats
from otel_guard_processor.otlp import RequestView

__all__ = ["SPANS_PER_STEP", "Detection"]

_log = logging.getLogger("otel_guard_processor")
T = TypeVar("T")

SPANS_PER_STEP: Final = 1024
"""Spans detected between two returns to the event loop (a few milliseconds of work)."""
_YIELD_AFTER: Final = 0.002
"""Seconds of back-to-back small jobs after which the consumer gives the event loop back."""

# A job: ("ingest", request, raw, now, done) | ("expire", now) | ("run", work, future)
_Job = tuple[Any, ...]


class Detection:
    """One detector, fed and read through one queue; see the module docstring."""

    def __init__(
        self,
        detector: Detector,
        stats: RequestStats,
        *,
        step: int = SPANS_PER_STEP,
    ) -> None:
        self.detector = detector
        self._stats = stats
        self._step = step
        self._jobs: deque[_Job] = deque()
        self._wake = asyncio.Event()
        self._consumer: asyncio.Task[None] | None = None  # started with the first job
        self._expiry_queued = False
        self._failed_once = False
        self._stopping = False

    def submit(self, request: RequestView, raw: bytes, now: float, done: Callable[[], None]) -> None:
        """Detect ``request`` (its protobuf bytes ``raw``, received at ``now``) after those before
        it; ``done()`` is called once it has been (or has failed)."""
        self._put(("ingest", request, raw, now, done))

    def expire(self, now: float) -> None:
        """Evict idle traces and count due tool edges, unless a sweep is still waiting its turn."""
        if not self._expiry_queued and not self._stopping:
            self._expiry_queued = True
            self._put(("expire", now))

    async def run(self, work: Callable[[], T | Awaitable[T]]) -> T:
        """``work()`` in the queue, after everything submitted before it; its result (awaited, when
        it is awaitable: the queue waits for it) or its exception."""
        if self._stopping:
            raise RuntimeError("detection has stopped")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._put(("run", work, future))
        return await future

    async def settled(self) -> None:
        """Return once every request submitted so far has been detected."""
        await self.run(_nothing)

    async def stop(self, timeout: float) -> None:
        """Detect what was submitted (for up to ``timeout`` seconds), end the consumer, then let go
        of the delegation trees held (each observed in ``otel_guard_tree_hops``)."""
        self._stopping = True
        consumer = self._consumer
        if consumer is None:
            self._release_trees()
            return
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
        self._release_trees()

    def _release_trees(self) -> None:
        # Once the consumer is gone: nothing else reads or changes the detector now.
        try:
            self.detector.release_trees()
        except Exception:
            _log.exception("otel-guard processor: letting go of the delegation trees failed")

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
            if kind == "ingest":
                await self._ingest(job[1], job[2], job[3], job[4])
            elif kind == "expire":
                self._expire(job[1])
            else:
                await self._run(job[1], job[2])
            now = time.perf_counter()
            if now - since >= _YIELD_AFTER:
                await asyncio.sleep(0)  # many small jobs in a row: let the loop serve the clients
                since = time.perf_counter()

    async def _ingest(self, request: RequestView, raw: bytes, now: float, done: Callable[[], None]) -> None:
        try:
            steps = self.detector.ingest_steps(request, raw, now, self._step)
            try:
                while True:
                    next(steps)
                    await asyncio.sleep(0)  # a slice is done: the clients' turn
            except StopIteration:
                pass
        except Exception:
            self._stats.detection_errors += 1
            if not self._failed_once:
                self._failed_once = True
                _log.exception("otel-guard processor: detection failed; spans still forwarded")
        finally:
            done()

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
