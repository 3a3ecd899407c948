"""Budgets for a whole delegation tree: what one chain root, and one workspace, may spend (docs/spec.md §2).

Depth and cycles do not bound cost: a planner that fans out to 20 workers, each fanning out to 20,
never repeats a name and never goes deeper than 3, and makes 420 hops. A budget counts what a *tree*
spends -- every hop of every branch, thread and process whose chain has the same ``root`` -- and the
hop that would go past it is refused with reason ``budget``.

A count lives in a *store* under a key, with a limit and an expiry:

* ``tree:{workspace}:{root}``: the hops of one tree, kept for as long as its chain lives (``ttl``
  from its first hop, plus the clock skew allowed between hosts);
* ``workspace:{workspace}:{window}``: the hops of the whole workspace in one fixed window of
  ``workspace_window`` seconds, aligned to the unix epoch.

:meth:`BudgetStore.take` adds one hop to every count a hop touches, *all or none*, and only if none
of them would go past its limit: two branches racing for the last hop never both get it. A refused
or would-refuse hop, or one in ``off`` mode, takes nothing. Every store counts the same numbers: a
count stops at :data:`MAX_COUNT`.

Stores: :class:`MemoryStore` (this process: the embedded default) and, for a fleet,
:class:`otel_guard.budget_redis.RedisStore` (``budget_store = "redis://..."``), where the check and the
count are one Lua script. A store that cannot answer raises :class:`StoreError` (:class:`BadCount`
when one key of the take holds no count); ``budget_on_error`` decides what the hop gets then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Final, NamedTuple, Protocol

from otel_guard.policy import CLOCK_SKEW
from otel_guard.settings import Settings, redacted_url

HOPS: Final = "hops"
WORKSPACE_HOPS: Final = "workspace_hops"
"""What ``otel_guard.budget.exhausted`` names: the tree's hops, or the workspace's."""

_log = logging.getLogger("otel_guard")

MAX_COUNT: Final = 2**53 - 1
"""The largest count, on every store: a count that would go past it stays at it, and a limit or an
amount above it is taken as it. The Redis store's script compares counts as Lua numbers (doubles),
exact up to here; no real budget comes near (9 * 10^15 tokens)."""


class StoreError(Exception):
    """The budget store could not be reached, or did not answer in time."""

    error_type = "StoreError"
    """What ``otel_guard.budget.store_errors`` counts it as (its ``error.type``)."""


class BadCount(StoreError):
    """A key of the take holds no count (``error_type`` ``bad_type``: another Redis type, such as a
    list; ``bad_value``: a string that is not a whole number from 0 to :data:`MAX_COUNT`).

    That take's error alone: nothing of the take is counted, and the store answers every other key.
    """

    def __init__(self, key: str, error_type: str) -> None:
        super().__init__(f"the budget store's key {key} does not hold a count ({error_type})")
        self.key = key
        self.error_type = error_type


def store_failure(exc: BaseException) -> str:
    """What a refusal says of a take that failed with ``exc``."""
    if isinstance(exc, BadCount):
        return str(exc)
    return f"the budget store could not be reached ({type(exc).__name__})"


MODEL_REQUESTS: Final = "model_requests"
TOKENS: Final = "tokens"


class Meter(NamedTuple):
    """One count a take adds to: its key in the store, its limit (0: none), when it expires (unix
    seconds), what a refusal names, and how much the take adds (0: it only checks that the count
    is below its limit, as a hop checks a tree's tokens)."""

    key: str
    limit: int
    expires_at: float
    budget: str  # HOPS, WORKSPACE_HOPS, MODEL_REQUESTS or TOKENS
    amount: int = 1


class BudgetStore(Protocol):
    """Where the counts live."""

    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        """Add each meter's amount to its count if none would go past its limit, atomically (a
        meter of amount 0 passes while its count is below its limit).

        Returns the counts after the take, one per meter; or, when a meter is spent, the index of
        the first such meter, and nothing is counted. Raises :class:`StoreError` when the store
        cannot answer.
        """
        ...

    async def atake(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        """:meth:`take` for async code: a store that waits on I/O awaits it."""
        ...


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


def tree_meter(settings: Settings, root: str, expires_at: float) -> Meter | None:
    """The meter of a tree's hops, or ``None`` when ``max_hops`` is off."""
    if not settings.max_hops:
        return None
    return Meter(f"tree:{settings.workspace}:{root}", settings.max_hops, expires_at + CLOCK_SKEW, HOPS)


def usage_meters(settings: Settings, root: str, expires_at: float, requests: int) -> tuple[Meter, ...]:
    """The meters of a tree's model requests and tokens that are on: ``requests`` (1 before a model
    request, 0 before a hop) is what the request meter adds; the token meter only checks."""
    meters: list[Meter] = []
    expires = expires_at + CLOCK_SKEW
    if settings.max_model_requests:
        key = f"tree:{settings.workspace}:{root}:model_requests"
        meters.append(Meter(key, settings.max_model_requests, expires, MODEL_REQUESTS, requests))
    if settings.max_tokens:
        meters.append(
            Meter(f"tree:{settings.workspace}:{root}:tokens", settings.max_tokens, expires, TOKENS, 0)
        )
    return tuple(meters)


def usage_spent(meter: Meter, root: str) -> str:
    """What a refusal says of a tree whose model requests or tokens are spent."""
    if meter.budget == MODEL_REQUESTS:
        return (
            f"Delegation budget: tree {root} has made its {meter.limit} model requests "
            f"(max_model_requests {meter.limit})"
        )
    return (
        f"Delegation budget: tree {root} has spent its {meter.limit} model tokens (max_tokens {meter.limit})"
    )


def tokens_meter(settings: Settings, root: str, expires_at: float, tokens: int) -> Meter:
    """The meter that adds a model response's ``tokens`` to its tree (no limit: the check is before)."""
    return Meter(f"tree:{settings.workspace}:{root}:tokens", 0, expires_at + CLOCK_SKEW, TOKENS, tokens)


class _WorkspaceWindows:
    """The meter of the workspace's current window, made once a window (hops ask it every time)."""

    def __init__(self) -> None:
        self._last: tuple[str, float, int, Meter] | None = None  # workspace, window, limit, meter

    def meter(self, settings: Settings, now: float) -> Meter | None:
        limit = settings.workspace_max_hops
        if not limit:
            return None
        window = settings.workspace_window
        index = int(now // window)
        last = self._last
        if last is not None and last[0] == settings.workspace and last[1] == window and last[2] == limit:
            meter = last[3]
            if meter.key.endswith(f":{index}"):
                return meter
        meter = Meter(
            f"workspace:{settings.workspace}:{window:g}:{index}",
            limit,
            (index + 1) * window + CLOCK_SKEW,
            WORKSPACE_HOPS,
        )
        self._last = (settings.workspace, window, limit, meter)
        return meter


workspace_meter = _WorkspaceWindows().meter


_stores: dict[str, BudgetStore] = {}
_stores_lock = threading.Lock()


def store_for(settings: Settings) -> BudgetStore:
    """The store ``settings.budget_store`` names, made once per process and location."""
    location = settings.budget_store
    store = _stores.get(location)
    if store is not None:
        return store
    with _stores_lock:
        store = _stores.get(location)
        if store is None:
            if location == "memory":
                store = MemoryStore()
            else:
                from otel_guard.budget_redis import RedisStore

                store = RedisStore(location)
            _stores[location] = store
    return store


def probe_store(settings: Settings) -> None:
    """Ask the store ``settings`` count in once, where the guard starts (an instrumentor, the ASGI
    middleware): a Redis that cannot be reached logs one warning now, within its timeout, instead of
    at the first hop. Nothing to ask for the memory store, or with every budget off."""
    if settings.budget_store == "memory" or not settings.budgets_on:
        return
    try:
        store = store_for(settings)
    except Exception as exc:  # the URL passed validation; the client refused it all the same
        _log.warning(
            "otel-guard: the budget store %s cannot be made (%s); budget_on_error is %s for every hop",
            redacted_url(settings.budget_store),
            type(exc).__name__,
            settings.budget_on_error,
        )
        return
    probe = getattr(store, "probe", None)
    if probe is not None:
        probe()


def reset_stores() -> None:
    """Forget every store (the memory store's counts with it): for tests."""
    with _stores_lock:
        _stores.clear()
