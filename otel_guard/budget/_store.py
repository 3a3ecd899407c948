"""The budget store's protocol, the meter a take adds to, and the errors a store raises.

What a reader would not guess: every store counts the same numbers, so a count stops at
:data:`MAX_COUNT` (where the Redis script's Lua numbers stop being exact), in memory too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple, Protocol

HOPS: Final = "hops"
WORKSPACE_HOPS: Final = "workspace_hops"
"""What ``otel_guard.budget.exhausted`` names: the tree's hops, or the workspace's."""


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


class SlotMigrating(StoreError):
    """A cluster take whose slot is moving between nodes (a reshard) and that redis-py could not
    finish within its redirections: a take of keys some of which have moved answers TRYAGAIN until
    the slot's move ends. That take's error alone, as :class:`BadCount` is: the store is not taken
    for down for the other trees."""

    error_type = "slot_migrating"


def store_failure(exc: BaseException) -> str:
    """What a refusal says of a take that failed with ``exc``."""
    if isinstance(exc, BadCount):
        return str(exc)
    return f"the budget store could not be reached ({type(exc).__name__})"


MODEL_REQUESTS: Final = "model_requests"
TOKENS: Final = "tokens"
COST: Final = "cost"
"""A tree's spend in micro-units of ``cost_currency``, and (its key ending ``:unpriced``) with
``budget_unpriced=refuse`` the count of its responses no price covered: both refuse as ``cost``."""


class Meter(NamedTuple):
    """One count a take adds to: its key in the store, its limit (0: none), when it expires (unix
    seconds), what a refusal names, and how much the take adds (0: it only checks that the count
    is below its limit, as a hop checks a tree's tokens)."""

    key: str
    limit: int
    expires_at: float
    budget: str  # HOPS, WORKSPACE_HOPS, MODEL_REQUESTS, TOKENS or COST
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
