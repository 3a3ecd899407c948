"""An OTLP/HTTP body made protobuf off the event loop: gzip inflated in bounded steps on threads,
OTLP/JSON converted in worker processes, both with at most one worker a core.

The event loop answers every gRPC call and ``/metrics`` too, so what takes long is not done on it:

- gzip is inflated in steps of at most ``inflate_step`` bytes out (the first, of at most
  ``inline_inflate`` bytes, on the loop: most bodies are done in it), each later step on a thread,
  and it stops the moment the inflated size passes the limit (:class:`TooLarge`): a bomb costs the
  inflation of the limit, never of the whole bomb. Each step's bytes are held in the request's
  reservation of the memory budget before they are kept: a request whose bytes would pass it stops
  there (:class:`Busy`).
- OTLP/JSON is converted by :func:`convert`, any failure a :class:`MalformedRequest` that says what
  and, for a number out of range, where.

What a reader would not guess: JSON goes to processes, not threads. protobuf's ``json_format`` is
Python and holds the interpreter lock all along, so a thread converting still takes the loop's
turns: two 7.8 MiB bodies converted on two threads put the loop's p99 lag at 154 ms (max 249 ms,
and the loop ran 7% of its idle turns); on two worker processes 12 ms (max 42 ms); on the loop itself
5.1 s. zlib lets go of the lock while it inflates, so threads do for gzip. A body up to
``inline_json`` bytes is converted on the loop: that takes less than the hand-over to a process.
The processes start (forkserver) with the first larger body, about a second, and stay; each holds
about 13 times the JSON it converts while it does (104 MiB at the peak for 7.8 MiB), and the
processor its pickled copy: :data:`JSON_HELD` times the body is held in the budget while it converts
(on the loop too), before it is handed over, so a flood of JSON is refused busy rather than held.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import select
import threading
import time
import zlib
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final

from otel_guard_processor._engine import Reservation
from otel_guard_processor.otlp import MalformedRequest, json_to_protobuf
from otel_guard_processor.signals import UNREAD

__all__ = ["JSON_HELD", "Busy", "Conversion", "TooLarge", "Unavailable", "convert"]

INFLATE_STEP: Final = 1 << 20
"""Bytes out of one inflation step on a thread (about a millisecond of zlib)."""
INLINE_INFLATE: Final = 64 << 10
"""Bytes out of the first inflation step, on the event loop (a few tens of microseconds)."""
INLINE_JSON: Final = 4 << 10
"""OTLP/JSON bodies up to this size are converted on the event loop (about a millisecond)."""
JSON_HELD: Final = 14
"""Bytes held in the memory budget a byte of OTLP/JSON while it converts: the worker's peak growth
(13.3 times the body, measured: ``tests/processor/test_memory_budget.py``) and the pickled copy."""


class TooLarge(Exception):
    """The body inflates past the limit."""


class Busy(Exception):
    """The inflated bytes would pass the memory budget."""


class Unavailable(Exception):
    """A conversion worker died (its pool starts again with the next body)."""


def convert(signal: str, body: bytes) -> bytes:
    """The protobuf encoding of an OTLP/JSON request of ``signal`` (``traces``, ``metrics`` or
    ``logs``). Any failure to read it raises :class:`MalformedRequest` saying what (and where, for
    a number out of range); nothing else but MemoryError escapes."""
    to_protobuf = json_to_protobuf if signal == "traces" else _UNREAD[signal].json_to_protobuf
    try:
        return to_protobuf(body)
    except (MalformedRequest, MemoryError):
        raise
    except RecursionError:
        raise MalformedRequest("not JSON this processor reads: nested too deeply") from None
    except Exception as exc:  # json_format's own faults: OverflowError for 1e400 in an enum, ...
        where = _first_unreadable_number(body)
        raise MalformedRequest(
            f"not an OTLP/JSON request this processor reads: {type(exc).__name__}: {str(exc)[:200]}"
            + (f"; a number out of range at {where}" if where else "")
        ) from None


_UNREAD = {signal.name: signal for signal in UNREAD}


def _first_unreadable_number(body: bytes) -> str | None:
    """The path of the first number in ``body`` that no protobuf field holds (infinite or NaN once
    read: ``1e400``), e.g. ``resourceSpans[0].scopeSpans[0].spans[0].kind``; None if none is."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path or "the top"
        if isinstance(value, dict):
            stack.extend(
                (item, f"{path}.{key}" if path else str(key)) for key, item in reversed(value.items())
            )
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{index}]") for index, item in reversed(list(enumerate(value))))
    return None


class Conversion:
    """The workers that inflate and convert request bodies; see the module docstring. ``stop()``
    ends them."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        inflate_step: int = INFLATE_STEP,
        inline_inflate: int = INLINE_INFLATE,
        inline_json: int = INLINE_JSON,
    ) -> None:
        self.workers = workers or len(os.sched_getaffinity(0))
        self._inflate_step = inflate_step
        self._inline_inflate = inline_inflate
        self._inline_json = inline_json
        self._threads: ThreadPoolExecutor | None = None
        self._processes: ProcessPoolExecutor | None = None

    async def inflate(self, body: bytes, limit: int, held: Reservation) -> bytes:
        """The gzip ``body`` inflated (one member or more, as RFC 1952 allows), every byte out held
        in ``held`` (which keeps them). Raises :class:`TooLarge` the moment it passes ``limit``
        bytes, :class:`Busy` when the budget cannot hold the next step's bytes, ``zlib.error`` when
        it is not gzip or ends inside a member."""
        gunzip = _Gunzip(body)
        parts: list[bytes] = []
        size = 0
        room = self._inline_inflate
        first = True
        while True:
            room = min(room, limit + 1 - size)
            if first:
                chunk = gunzip.step(room)
                first = False
            else:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="otel-guard-inflate")
                chunk = await asyncio.get_running_loop().run_in_executor(self._threads, gunzip.step, room)
            if chunk is None:
                break
            size += len(chunk)
            if size > limit:
                raise TooLarge
            if not held.grow(len(chunk)):
                raise Busy
            parts.append(chunk)
            room = self._inflate_step
        gunzip.finish()
        # The join is not held: a moment's copy on the event loop, one at a time.
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def to_protobuf(self, signal: str, body: bytes, held: Reservation) -> bytes:
        """:func:`convert` of ``body``: on the loop when it is small, else in a worker process,
        :data:`JSON_HELD` times the body held in ``held`` meanwhile. Raises :class:`Busy` when the
        budget cannot hold that, :class:`MalformedRequest`, :class:`Unavailable` when the worker
        died."""
        share = JSON_HELD * len(body)
        if not held.grow(share):
            raise Busy
        try:
            return await self._convert(signal, body)
        finally:
            held.shrink(share)

    async def _convert(self, signal: str, body: bytes) -> bytes:
        if len(body) <= self._inline_json:
            return convert(signal, body)
        if self._processes is None:
            context = multiprocessing.get_context("forkserver")
            self._processes = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_end_with, initargs=(os.getpid(),)
            )
        pool = self._processes
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, convert, signal, body)
        except (BrokenProcessPool, MemoryError):
            if self._processes is pool:
                self._processes = None
                pool.shutdown(wait=False, cancel_futures=True)
            raise Unavailable from None

    def stop(self) -> None:
        """End the workers; a body still converting is abandoned (its request is answered as the
        server stops)."""
        pools: tuple[Executor | None, ...] = (self._threads, self._processes)
        self._threads = self._processes = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)


def _end_with(processor: int) -> None:
    """A worker's initializer: the worker ends when the processor does, however it ends (killed
    too). Else it would outlive it: each worker holds both ends of its pool's queue, so it never
    reads the end of it, and the forkserver lives as long as a worker does."""
    try:
        watched = os.pidfd_open(processor)
    except ProcessLookupError:
        os._exit(0)
    except OSError:  # no pidfd (Linux before 5.3): look every second
        watched = -1

    def wait() -> None:
        if watched >= 0:
            select.select([watched], [], [])
        else:
            while _alive(processor):
                time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=wait, name="otel-guard-processor-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Gunzip:
    """Inflates a gzip body of one member or more, as RFC 1952 allows (concatenating writers and
    some proxies send several), a step of at most ``room`` bytes out (and about as many in) at a
    time. A body that ends inside a member is an error, never a short read."""

    def __init__(self, body: bytes) -> None:
        self._member = zlib.decompressobj(wbits=31)
        self._input = body
        self._inside = False  # the current member has begun and not ended
        self._full = False  # the last step filled its room: zlib may hold more output

    def step(self, room: int) -> bytes | None:
        """Up to ``room`` bytes more of the body inflated (from about as many in at most); None
        once it is all out."""
        if not (self._input or self._full):
            return None
        out: list[bytes] = []
        taken, most = 0, room
        while room > 0 and taken < most and (self._input or self._full):
            self._inside = True
            before = len(self._input)
            chunk = self._member.decompress(self._input, room)
            self._full = len(chunk) == room
            out.append(chunk)
            room -= len(chunk)
            if self._member.eof:
                # The member ended; what follows it is the next member.
                self._input = self._member.unused_data
                self._member = zlib.decompressobj(wbits=31)
                self._inside = self._full = False
            else:
                self._input = self._member.unconsumed_tail
            taken += before - len(self._input)
        return b"".join(out)

    def finish(self) -> None:
        if self._inside:
            raise zlib.error("truncated gzip stream")
