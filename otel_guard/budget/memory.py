"""The memory store: counts in this process, under one lock (the embedded default)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Final

from otel_guard.budget._store import MAX_COUNT, Meter


class MemoryStore:
    """Counts in this process, under one lock: right for one process, and the embedded default.

    Expired counts are swept now and then; the tree counts are kept in the order their trees were
    first seen, which is nearly the order in which they expire (every chain lives ``ttl``), so a
    sweep stops at the first count still alive.
    """

    SWEEP_EVERY: Final = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[float]] = {}  # key -> [count, expires_at]
        self._takes = 0

    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        with self._lock:
            counts = self._counts
            if len(meters) == 1:  # the common case: one tree, no workspace cap
                meter = meters[0]
                entry = counts.get(meter.key)
                if entry is None or entry[1] <= now:
                    if entry is not None:
                        del counts[meter.key]  # expired: it starts again, at the end of the order
                    entry = counts[meter.key] = [0, meter.expires_at]
                count = int(entry[0])
                amount = min(meter.amount, MAX_COUNT)
                if meter.limit and count + (amount or 1) > min(meter.limit, MAX_COUNT):
                    return 0
                entry[0] = count = min(count + amount, MAX_COUNT)
                taken: tuple[int, ...] | int = (count,)
            else:
                taken = self._take_all(counts, meters, now)
            self._takes += 1
            if self._takes >= self.SWEEP_EVERY:
                self._takes = 0
                self._sweep(now)
            return taken

    async def atake(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        """:meth:`take` for async code (it never waits: a lock held for a few dict operations)."""
        return self.take(meters, now)

    @staticmethod
    def _take_all(
        counts: dict[str, list[float]], meters: Sequence[Meter], now: float
    ) -> tuple[int, ...] | int:
        entries = []
        for index, meter in enumerate(meters):
            entry = counts.get(meter.key)
            if entry is None or entry[1] <= now:
                entry = None  # new, or expired: it starts again
                count = 0
            else:
                count = int(entry[0])
            limit = min(meter.limit, MAX_COUNT)
            if limit and count + (min(meter.amount, MAX_COUNT) or 1) > limit:
                return index
            entries.append(entry)
        taken = []
        for meter, found in zip(meters, entries, strict=True):
            entry = found
            if entry is None:
                counts.pop(meter.key, None)  # an expired count goes to the end of the order
                entry = counts[meter.key] = [0, meter.expires_at]
            entry[0] = count = min(int(entry[0]) + meter.amount, MAX_COUNT)
            taken.append(count)
        return tuple(taken)

    def _sweep(self, now: float) -> None:
        counts = self._counts
        expired = []
        for key, (_, expires_at) in counts.items():
            if expires_at > now:
                if key.startswith("tree:"):
                    break  # the tree counts after it are younger still
                continue
            expired.append(key)
        for key in expired:
            del counts[key]

    def used(self, key: str, now: float) -> int:
        """The count under ``key`` now (0 when none or expired): for tests and ``inspect``."""
        with self._lock:
            entry = self._counts.get(key)
            return int(entry[0]) if entry is not None and entry[1] > now else 0

    def __len__(self) -> int:
        return len(self._counts)
