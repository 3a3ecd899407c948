"""The memory store: counts in this process, under one lock (the embedded default).

What a reader would not guess: it holds at most :data:`MAX_ENTRIES` counts, however many fresh trees
arrive within a ``ttl`` (every anonymous request at a guarded service is one); past it, the counts of
the oldest trees not used since go first, each drop counted in ``otel_guard.budget.store_evictions``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Final

from otel_guard.budget._store import MAX_COUNT, Meter
from otel_guard.telemetry import METRIC_STORE_EVICTIONS, count_store_eviction

__all__ = ["MAX_ENTRIES", "METRIC_STORE_EVICTIONS", "MemoryStore"]

MAX_ENTRIES: Final = 100_000
"""The most counts the memory store holds (a tree's hops, model requests and tokens are one each; a
workspace window one): about 27 MB with their keys. Past it, a new count drops the oldest tree count
not used since it was last passed over (a tree in use gets a second chance), and
``otel_guard.budget.store_evictions`` counts the drop. A dropped tree starts again from 0 if it comes
back."""


class MemoryStore:
    """Counts in this process, under one lock: right for one process, and the embedded default.

    Expired counts are swept now and then; the tree counts are kept in the order their trees were
    first seen, which is nearly the order in which they expire (every chain lives ``ttl``), so a
    sweep stops at the first count still alive.

    At most ``max_entries`` counts (:data:`MAX_ENTRIES`): a new count past it makes room as a clock
    does (second chance) -- from the oldest, an expired count goes, a count used since it was last
    passed over (or a workspace's) is marked unused and moved to the end, and the first tree count
    that is neither is dropped (:data:`METRIC_STORE_EVICTIONS`).
    """

    SWEEP_EVERY: Final = 1024

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        # key -> [count, expires_at, used since last passed over (0 or 1)]
        self._counts: OrderedDict[str, list[float]] = OrderedDict()
        self._takes = 0
        self._max_entries = max(1, max_entries)

    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        with self._lock:
            counts = self._counts
            if len(meters) == 1:  # one tree, no workspace cap
                meter = meters[0]
                entry = counts.get(meter.key)
                if entry is None or entry[1] <= now:
                    entry = self._fresh(meter.key, meter.expires_at, now, entry is not None)
                else:
                    entry[2] = 1
                count = int(entry[0])
                amount = min(meter.amount, MAX_COUNT)
                if meter.limit and count + (amount or 1) > min(meter.limit, MAX_COUNT):
                    return 0
                entry[0] = count = min(count + amount, MAX_COUNT)
                taken: tuple[int, ...] | int = (count,)
            else:
                taken = self._take_all(meters, now)
            self._takes += 1
            if self._takes >= self.SWEEP_EVERY:
                self._takes = 0
                self._sweep(now)
            return taken

    def take_hop(self, tree: tuple[str, int, float], now: float) -> int:
        """:meth:`take` of one hop from a tree's count alone (``tree``: its key, limit and expiry), the
        common case (max_hops on, no other budget), with nothing made: the count after the take, or
        -1 when it would go past the limit (nothing taken)."""
        key, limit, expires_at = tree
        lock = self._lock
        lock.acquire()  # not `with`: its two bound methods and __exit__'s arguments cost a tenth of a take
        try:
            entry = self._counts.get(key)
            if entry is None or entry[1] <= now:
                entry = self._fresh(key, expires_at, now, entry is not None)
            else:
                entry[2] = 1
            count = int(entry[0])
            # count + 1 > min(limit, MAX_COUNT), and min(count + 1, MAX_COUNT), without min(): a
            # builtin that parses keywords costs as much as the rest of the take.
            if limit and count >= (limit if limit < MAX_COUNT else MAX_COUNT):
                return -1
            if count < MAX_COUNT:
                entry[0] = count = count + 1
            self._takes += 1
            if self._takes >= self.SWEEP_EVERY:
                self._takes = 0
                self._sweep(now)
            return count
        finally:
            lock.release()

    def _fresh(self, key: str, expires_at: float, now: float, expired: bool) -> list[float]:
        """A new count under ``key`` (``expired``: one was there: it starts again, at the end of the
        order), room made for it first when the store is full."""
        counts = self._counts
        if expired:
            del counts[key]
        elif len(counts) >= self._max_entries:
            self._make_room(now)
        entry = counts[key] = [0, expires_at, 0]
        return entry

    async def atake(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        """:meth:`take` for async code (it never waits: a lock held for a few dict operations)."""
        return self.take(meters, now)

    def _take_all(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        counts = self._counts
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
                if counts.pop(meter.key, None) is None and len(counts) >= self._max_entries:
                    self._make_room(now, keep=meters)
                entry = counts[meter.key] = [0, meter.expires_at, 0]  # expired: to the end
            else:
                entry[2] = 1
            entry[0] = count = min(int(entry[0]) + meter.amount, MAX_COUNT)
            taken.append(count)
        return tuple(taken)

    def _make_room(self, now: float, keep: Sequence[Meter] = ()) -> None:
        """Take one count out, as a clock does (see the class), before a new one goes in: never a
        workspace's, nor one of ``keep`` (the take's own)."""
        counts = self._counts
        kept = {meter.key for meter in keep}
        for _ in range(2 * len(counts) + 1):  # each count is passed over at most twice
            key, entry = counts.popitem(last=False)
            if entry[1] <= now:
                return  # expired: no count lost
            if entry[2] or key in kept or not key.startswith("tree:"):
                entry[2] = 0
                counts[key] = entry  # a second chance, at the end of the order
                continue
            count_store_eviction()
            return

    def _sweep(self, now: float) -> None:
        counts = self._counts
        expired = []
        for key, (_, expires_at, _) in counts.items():
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
