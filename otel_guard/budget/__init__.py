"""Budgets for a whole delegation tree: what one chain root, and one workspace, may spend (docs/spec.md §2).

Depth and cycles do not bound cost: a planner that fans out to 20 workers, each fanning out to 20,
never repeats a name and never goes deeper than 3, and makes 420 hops. A budget counts what a *tree*
spends -- every hop of every branch, thread and process whose chain has the same ``root`` -- and the
hop that would go past it is refused with reason ``budget``.

A count lives in a *store* under a key, with a limit and an expiry:

* ``tree:{workspace}:{root}``: the hops of one tree, kept for as long as its chain lives (``ttl``
  from its first hop, plus the clock skew allowed between hosts);
* ``workspace:{workspace}:{window}``: the hops of the whole workspace in one fixed window of
  ``workspace_window`` seconds, aligned to the unix epoch;
* ``tree:{workspace}:{root}:model_requests``, ``...:tokens``, ``...:cost`` (micro-units of
  ``cost_currency``) and ``...:unpriced``: what the tree spent on models (:mod:`otel_guard.usage`).

:meth:`BudgetStore.take` adds one hop to every count a hop touches, *all or none*, and only if none
of them would go past its limit: two branches racing for the last hop never both get it. A refused
or would-refuse hop, or one in ``off`` mode, takes nothing. Every store counts the same numbers: a
count stops at :data:`MAX_COUNT`.

Stores: :class:`MemoryStore` (this process: the embedded default) and, for a fleet,
:class:`otel_guard.budget.redis_store.RedisStore` (``budget_store = "redis://..."``), where the check and the
count are one Lua script. A store that cannot answer raises :class:`StoreError` (:class:`BadCount`
when one key of the take holds no count); ``budget_on_error`` decides what the hop gets then.
"""

from __future__ import annotations

import logging
import threading

from otel_guard.budget._store import (
    COST,
    HOPS,
    MAX_COUNT,
    MODEL_REQUESTS,
    TOKENS,
    WORKSPACE_HOPS,
    BadCount,
    BudgetStore,
    Meter,
    StoreError,
    store_failure,
)
from otel_guard.budget.memory import MemoryStore
from otel_guard.budget.meters import (
    spend_meters,
    tokens_meter,
    tree_meter,
    usage_meters,
    usage_spent,
    workspace_meter,
)
from otel_guard.settings import Settings, redacted_url

__all__ = [
    "COST",
    "HOPS",
    "MAX_COUNT",
    "MODEL_REQUESTS",
    "TOKENS",
    "WORKSPACE_HOPS",
    "BadCount",
    "BudgetStore",
    "MemoryStore",
    "Meter",
    "StoreError",
    "probe_store",
    "reset_stores",
    "spend_meters",
    "store_failure",
    "store_for",
    "tokens_meter",
    "tree_meter",
    "usage_meters",
    "usage_spent",
    "workspace_meter",
]

_log = logging.getLogger("otel_guard")

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
                from otel_guard.budget.redis_store import RedisStore

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
