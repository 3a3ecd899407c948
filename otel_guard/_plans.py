"""What a hop decides once and reuses: the plan of a hop from one chain, and what first hops share.

A plan holds nothing that depends on the moment or the parent context, so the same hop from the same
chain reuses it (it hangs on the chain's token); a chain's first hop is always allowed, so every first
hop into one name shares all but its root, its times and what depends on them.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.util.types import AttributeValue

from otel_guard import telemetry as names
from otel_guard._spending import tree_count
from otel_guard.budget import Meter, usage_meters
from otel_guard.chain import Chain, ChainToken, Hop, start_chain
from otel_guard.policy import ALLOW, Verdict
from otel_guard.settings import Settings

_BAGGAGE_KEY = names.CHAIN_BAGGAGE_KEY


class Plan:
    """Everything a hop decided and built from one chain, before its span.

    Nothing in it depends on the moment or the parent context, so the plan of a hop that was allowed
    is kept on the token of the chain it came from (:attr:`ChainToken.children`): the same hop from
    the same chain (an agent calling one tool again and again) reuses it while the settings stay the
    same object and the chain has not expired.
    """

    __slots__ = (
        "arrival",
        "attributes",
        "budgeted",
        "carried",
        "hop",
        "meters",
        "own_baggage",
        "received",
        "settings",
        "span_name",
        "tally",
        "token",
        "valid_until",
        "verdict",
    )

    def __init__(
        self,
        hop: Hop,
        verdict: Verdict,
        token: ChainToken,
        carried: bool,
        settings: Settings,
        attributes: dict[str, AttributeValue],
        span_name: str,
        tally: names.HopKey,
        valid_until: float,
        arrival: Chain | None = None,
        budgeted: bool = False,
        received: bool = False,
    ) -> None:
        self.arrival = arrival  # the chain the hop arrived with (what a refusal names)
        # Whether each hop made from this plan goes to the budgets (an allowed hop, not in off mode);
        # whether it is one the caller's process counted already (checked: otel_guard._spending);
        # the tree's hop count (limited by max_hops, if on) and model budgets.
        self.budgeted = budgeted
        self.received = received
        self.meters: tuple[Meter, ...] = ()
        if budgeted:
            # The tree's hops count; its model requests and tokens, when those budgets are on, are
            # only checked (a tree that spent them makes no more hops either).
            expires_at = token.chain.expires_at
            self.meters = (
                tree_count(settings, token.root, expires_at),
                *usage_meters(settings, token.root, expires_at, 0),
            )
        self.hop = hop
        self.verdict = verdict
        self.token = token  # the chain including this hop
        self.carried = carried  # False: too large for baggage (off mode), the hop carries no chain
        self.settings = settings
        self.attributes = attributes
        self.span_name = span_name
        self.tally = tally
        self.valid_until = valid_until  # the chain's expiry: then the hop is decided afresh
        # The baggage of a hop made in a context whose baggage holds nothing but the chain (the usual
        # case): the same for every such hop, and never changed in place, so it is shared.
        self.own_baggage: dict[str, object] = {_BAGGAGE_KEY: token} if carried else {}

    def child_baggage(self, parent_baggage: Mapping[str, object] | None) -> dict[str, object]:
        """The baggage of a hop made from this plan in a context with ``parent_baggage``."""
        if not parent_baggage or (len(parent_baggage) == 1 and _BAGGAGE_KEY in parent_baggage):
            return self.own_baggage
        child_baggage = dict(parent_baggage)
        # A token the propagator would drop is never produced: in off mode such a hop carries no chain.
        if self.carried:
            child_baggage[_BAGGAGE_KEY] = self.token
        else:
            child_baggage.pop(_BAGGAGE_KEY, None)
        return child_baggage


class FirstHop:
    """What every first hop of a chain into the same (agent, skill, kind) shares, under one settings
    object: a first hop is always allowed (docs/spec.md §3: nothing to repeat, depth 1), so only its
    root, its times and what depends on them (token, budget meters, the root attribute) are new.

    Every agent run of a runtime starts a chain, so this is the hop a runtime makes most.
    """

    __slots__ = (
        "after",
        "before",
        "budgeted",
        "hop",
        "in_force",
        "keyring",
        "settings",
        "span_name",
        "tally",
    )

    def __init__(self, plan: Plan, settings: Settings) -> None:
        self.in_force = plan.settings
        self.settings = settings
        self.keyring = settings.keys
        self.hop = plan.hop
        # The attributes in their order, the root's place kept.
        items = list(plan.attributes.items())
        at = [key for key, _ in items].index(names.CHAIN_ROOT)
        self.before = dict(items[:at])
        self.after = dict(items[at + 1 :])
        self.span_name = plan.span_name
        self.tally = plan.tally
        self.budgeted = plan.budgeted

    def plan(self, now: float) -> Plan:
        settings = self.settings
        token = ChainToken(start_chain(self.hop, settings.workspace, now, settings.ttl), self.keyring)
        return Plan(
            self.hop,
            ALLOW,
            token,
            True,
            self.in_force,
            {**self.before, names.CHAIN_ROOT: token.root, **self.after},
            self.span_name,
            self.tally,
            now,
            budgeted=self.budgeted,
        )


class FirstHops:
    """The :class:`FirstHop` of each hop key (bounded: emptied when full; dict operations are atomic)."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._items: dict[tuple[str, str | None, str], FirstHop] = {}

    def get(self, key: tuple[str, str | None, str], in_force: Settings) -> FirstHop | None:
        first = self._items.get(key)
        return first if first is not None and first.in_force is in_force else None

    def keep(self, key: tuple[str, str | None, str], plan: Plan, settings: Settings) -> None:
        if len(self._items) >= self._size:
            self._items.clear()
        self._items[key] = FirstHop(plan, settings)


first_hops = FirstHops()
