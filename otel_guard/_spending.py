"""What a hop asks of its budget store: the meters it takes, and for a hop its caller counted
already, the take-by-take that checks it without counting it twice (docs/spec.md §2).

What a reader would not guess: a received hop (the server side of a hop its caller's process made
and counted) is not free. It claims one of the hops its tree has made; a token sent again once every
hop of its tree has been received is counted as a new hop, so a captured token buys no more than the
tree's own budget (see :class:`_Takes`).
"""

from __future__ import annotations

import time
from typing import Final

from otel_guard.budget import (
    HOPS,
    WORKSPACE_HOPS,
    BudgetStore,
    Meter,
    tree_meter,
    usage_spent,
    workspace_meter,
)
from otel_guard.policy import CLOCK_SKEW
from otel_guard.settings import Settings

Taken = tuple[int, ...] | int
"""A store's answer: each meter's count after the take, or the index of the first meter it would
take past its limit (nothing taken)."""


class StoreFailed(Exception):
    """The store could not answer ``meters`` (``error``, its own exception)."""

    def __init__(self, meters: tuple[Meter, ...], error: Exception) -> None:
        super().__init__(str(error))
        self.meters = meters
        self.error = error


def spend(
    store: BudgetStore, meters: tuple[Meter, ...], settings: Settings, received: bool
) -> tuple[tuple[Meter, ...], Taken]:
    """Take a hop's ``meters`` (and the workspace's) from ``store``: the meters of the take that
    decides the hop, and the store's answer to it. Raises :class:`StoreFailed`."""
    now = time.time()
    if not received:
        counted = _counted(meters, settings, False, now)
        try:
            return counted, store.take(counted, now)
        except Exception as exc:
            raise StoreFailed(counted, exc) from exc
    takes = _Takes(meters, settings, now)
    try:
        while takes.answer(store.take(takes.meters, now)):
            pass
    except Exception as exc:
        raise StoreFailed(takes.meters, exc) from exc
    return takes.meters, takes.taken


async def aspend(
    store: BudgetStore, meters: tuple[Meter, ...], settings: Settings, received: bool
) -> tuple[tuple[Meter, ...], Taken]:
    """:func:`spend`, awaiting a store that has an asyncio API."""
    now = time.time()
    if not received:
        counted = _counted(meters, settings, False, now)
        try:
            return counted, await store.atake(counted, now)
        except Exception as exc:
            raise StoreFailed(counted, exc) from exc
    takes = _Takes(meters, settings, now)
    try:
        while takes.answer(await store.atake(takes.meters, now)):
            pass
    except Exception as exc:
        raise StoreFailed(takes.meters, exc) from exc
    return takes.meters, takes.taken


def spent_message(settings: Settings, root: str, agent: str, meter: Meter, received: bool) -> str:
    """The text of a refusal (or would-refuse) of a hop into ``agent`` past ``meter``'s limit."""
    if meter.budget == HOPS and received:
        return (
            f"Delegation budget: tree {root} has made its {meter.limit} hops (max_hops "
            f"{meter.limit}) and each has been received; agent {agent} received its chain once more"
        )
    if meter.budget == HOPS:
        return (
            f"Delegation budget: tree {root} has made its {meter.limit} hops (max_hops "
            f"{meter.limit}); calling agent {agent} would make one more"
        )
    if meter.budget != WORKSPACE_HOPS:
        return f"{usage_spent(meter, root, settings)}; agent {agent} refused"
    return (
        f"Delegation budget: workspace {settings.workspace!r} has made its {meter.limit} hops "
        f"this window (workspace_max_hops {meter.limit} per {settings.workspace_window:g} s); "
        f"agent {agent} refused, tree {root}"
    )


def tree_count(settings: Settings, root: str, expires_at: float) -> Meter:
    """The meter of a tree's hops: limited by ``max_hops``, or with no limit when it is off (a hop
    its caller counted is still checked against what its tree has counted: see :class:`_Takes`)."""
    meter = tree_meter(settings, root, expires_at)
    if meter is None:
        meter = Meter(f"tree:{settings.workspace}:{root}", 0, expires_at + CLOCK_SKEW, HOPS)  # tree_meter's
    return meter


_RECEIVED: Final = ":received"
"""The key suffix of the count of a tree's hops that were received (see :class:`_Takes`)."""

_PEEK, _CLAIM, _COUNT = range(3)


def _counted(meters: tuple[Meter, ...], settings: Settings, received: bool, now: float) -> tuple[Meter, ...]:
    """The meters of a hop counted here: its tree's, its model budgets, the workspace's (and for a
    received hop, its claim: see :class:`_Takes`)."""
    workspace = workspace_meter(settings, now)
    meters = meters if workspace is None else (*meters, workspace)
    if received:
        tree = meters[0]
        meters = (tree, _received(tree, 0), *meters[1:])
    return meters


def _received(tree: Meter, limit: int) -> Meter:
    """The meter of a tree's received hops, limited by ``limit`` (0: none), adding one."""
    return Meter(tree.key + _RECEIVED, limit, tree.expires_at, HOPS)


class _Takes:
    """What a received hop (one its caller counted already) asks of its budget store, take by take.

    It is checked, never added twice. Its first take adds nothing: it reads the tree's hop count (a
    meter with no limit and nothing to add) and checks the tree's model budgets; its second claims
    one of those hops as received (a count of the tree's received hops, limited by its hop count).
    So a tree's hops are received at most as many times as it has made them: a token sent again (a
    replay) once every hop of its tree has been received finds none to claim, and is counted instead
    as a new hop, with its claim, against ``max_hops`` and ``workspace_max_hops``, and refused with
    reason ``budget`` once either is spent. So is a hop whose caller counted it in another store (the
    memory store of another process): its tree has nothing here to claim.

    When no take follows, :attr:`meters` and :attr:`taken` are the take that decides the hop.
    """

    __slots__ = ("_hop_meters", "_now", "_peek", "_settings", "_stage", "meters", "taken")

    def __init__(self, meters: tuple[Meter, ...], settings: Settings, now: float) -> None:
        self._hop_meters = meters
        self._settings = settings
        self._now = now
        self._stage = _PEEK
        tree = meters[0]
        self._peek = self.meters = (tree._replace(limit=0, amount=0), *meters[1:])
        self.taken: tuple[int, ...] | int = ()

    def answer(self, taken: tuple[int, ...] | int) -> bool:
        """Read the store's answer to :attr:`meters`; whether another take follows (new meters)."""
        stage = self._stage
        if stage == _PEEK:
            self.taken = taken
            if isinstance(taken, int):  # a model budget is spent
                return False
            if taken[0]:
                self._stage = _CLAIM
                self.meters = (_received(self._peek[0], taken[0]),)
                return True
        elif stage == _CLAIM:
            if not isinstance(taken, int):
                self.meters = self._peek  # claimed: the tree's count as read is the hop's
                return False
        else:
            self.taken = taken
            return False
        # Nothing of the tree's is left to claim here: the hop is counted as a new one.
        self._stage = _COUNT
        self.meters = _counted(self._hop_meters, self._settings, True, self._now)
        return True
