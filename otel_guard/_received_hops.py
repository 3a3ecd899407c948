"""The plan of a hop a service receives, shared by every chain that arrives along the same path.

A service is called with chains that differ only in their root and times, request after request (its
callers' paths are few). The decision of the hop into it is a pure function of the arriving path, its
workspace, its lifetime and times, and the settings (docs/spec.md §3), so an allowed one is kept
under the path and made again for the next chain as :class:`otel_guard._plans.SharedHop` makes a
first hop: its token, its root attribute and its budget meters anew, the rest shared. What a reader
would not guess: the arriving chain's times are checked again here (what ``policy.integrity`` checks
of them: not expired, not issued in the future, a lifetime within ``ttl``), because a chain from
another process may carry any lifetime; its workspace is part of the key.
"""

from __future__ import annotations

from otel_guard._plans import Plan, PlanKey, SharedHop
from otel_guard.chain import ChainToken, Hop
from otel_guard.policy import CLOCK_SKEW
from otel_guard.settings import Settings

ReceivedKey = tuple[PlanKey, str, tuple[Hop, ...], tuple[type[Hop], ...]]
"""The hop's key, the arriving chain's workspace, its hops and their kinds (a transfer and a call
into the same names are equal tuples)."""


class ReceivedHops:
    """The :class:`SharedHop` of each (hop, arriving path) whose decision was an allowed hop (bounded:
    emptied when ``size`` are kept; ``ReceivedHops(0)`` keeps none, so every received hop is decided)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._items: dict[ReceivedKey, SharedHop] = {}

    def plan(
        self, key: PlanKey, arrived: ChainToken, in_force: Settings, settings: Settings, now: float
    ) -> Plan | None:
        """The plan of the hop ``key`` from ``arrived`` made now, when a hop from its path was allowed
        under ``in_force``; ``None`` when it must be decided (``settings``: the agent's)."""
        items = self._items
        if not items:
            return None
        arrival = arrived.chain
        hops = arrival.hops
        shared = items.get((key, arrival.workspace, hops, tuple(map(type, hops))))
        if (
            shared is None
            or shared.in_force is not in_force
            or arrival.expires_at - arrival.issued_at > settings.ttl + CLOCK_SKEW
        ):
            return None
        return shared.plan(now, arrived)  # None when its times or its new token's size say decide

    def keep(self, key: PlanKey, plan: Plan, settings: Settings) -> None:
        """Keep the allowed ``plan`` of the hop ``key`` from the chain it arrived with."""
        arrival = plan.arrival
        if arrival is None:
            return
        if len(self._items) >= self._size:
            self._items.clear()
            if not self._size:
                return
        hops = arrival.hops
        self._items[key, arrival.workspace, hops, tuple(map(type, hops))] = SharedHop(plan, settings)


received_hops = ReceivedHops()
