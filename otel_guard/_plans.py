"""What a hop decides once and reuses: the plan of a hop from one chain, and what hops of one path share.

A plan holds nothing that depends on the moment or the parent context, so the same hop from the same
chain reuses it (it hangs on the chain's token). A chain's first hop is always allowed, so every first
hop into one name shares all but its root, its times and what depends on them; so does every next hop
from the chains those make (an agent run's tool call, run after run), down the path.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.util.types import AttributeValue

from otel_guard import telemetry as names
from otel_guard._spending import tree_count
from otel_guard.budget import Meter, usage_meters
from otel_guard.chain import MAX_TOKEN_LENGTH, Chain, ChainToken, Hop, start_chain
from otel_guard.policy import ALLOW, CLOCK_SKEW, Verdict
from otel_guard.settings import Settings

_BAGGAGE_KEY = names.CHAIN_BAGGAGE_KEY
_CHAIN_LISTS = (names.CHAIN_AGENTS, names.CHAIN_SKILLS)

TAKE_ALONE = True
"""Whether a hop whose take is its tree's hop count alone (no other budget on, not a received hop)
takes it through the memory store's :meth:`~otel_guard.budget.MemoryStore.take_hop` (False: through
:func:`otel_guard._spending.spend`, as every other hop; for tests)."""

PlanKey = tuple[str, str | None, str]
"""A hop's (agent, skill, kind): what its plans and shared hops are kept under. The kind is
``agent``, ``tool`` or ``transfer`` (an agent hop of kind transfer: its decision is not a call's)."""


class Plan:
    """Everything a hop decided and built from one chain, before its span.

    Nothing in it depends on the moment or the parent context, so the plan of a hop that was allowed
    is kept on the token of the chain it came from (:attr:`ChainToken.children`): the same hop from
    the same chain (an agent calling one tool again and again) reuses it while the settings stay the
    same object and the chain has not expired.
    """

    __slots__ = (
        "alone",
        "arrival",
        "attributes",
        "budgeted",
        "carried",
        "hop",
        "lean",
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
        # A hop counted alone: its tree's (key, limit, expiry) for the memory store's take_hop.
        self.alone: tuple[str, int, float] | None = None
        if budgeted:
            # The tree's hops count; its model requests and tokens, when those budgets are on, are
            # only checked (a tree that spent them makes no more hops either).
            # A hop's chain lives as long as the one it arrived with: a child token's chain is
            # then never built just for its expiry.
            expires_at = (arrival if arrival is not None else token.chain).expires_at
            self.meters = (
                tree_count(settings, token.root, expires_at),
                *usage_meters(settings, token.root, expires_at, 0),
            )
            tree = self.meters[0]
            if TAKE_ALONE and len(self.meters) == 1 and not received and not settings.workspace_max_hops:
                self.alone = (tree.key, tree.limit, tree.expires_at)  # all _spending.spend would take
        self.hop = hop
        self.verdict = verdict
        self.token = token  # the chain including this hop
        self.carried = carried  # False: too large for baggage (off mode), the hop carries no chain
        self.settings = settings
        self.attributes = attributes
        self.lean: dict[str, AttributeValue] | None = None  # lean_attributes(), made when first asked
        self.span_name = span_name
        self.tally = tally
        self.valid_until = valid_until  # the chain's expiry: then the hop is decided afresh
        # The baggage of a hop made in a context whose baggage holds nothing but the chain (the usual
        # case): the same for every such hop, and never changed in place, so it is shared.
        self.own_baggage: dict[str, object] = {_BAGGAGE_KEY: token} if carried else {}

    def lean_attributes(self) -> dict[str, AttributeValue]:
        """:attr:`attributes` without the chain's lists: those of a hop nested in the previous hop's
        span, whose path is its ancestors' (docs/spec.md §9, lean hop spans)."""
        lean = self.lean
        if lean is None:
            lean = self.lean = {
                key: value for key, value in self.attributes.items() if key not in _CHAIN_LISTS
            }
        return lean

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


class SharedHop:
    """What every hop into the same (agent, skill, kind) from a chain with the same path shares,
    under one settings object: a chain's first hop, or the next hop from a chain the guard made
    from a shared hop (its token's :attr:`~otel_guard.chain.ChainToken.kin`).

    Every agent run of a runtime starts a chain, so these are the hops a runtime makes most. The
    decision is a pure function of the path, the workspace, the lifetime, the times and the
    settings (docs/spec.md §3); chains made here from one shared hop have the same path, workspace
    and lifetime, so only their times are checked again: what is new is the root, the times, and
    what depends on them (token, budget meters, the root attribute). Only allowed hops are shared.
    """

    __slots__ = (
        "after",
        "before",
        "budgeted",
        "hop",
        "in_force",
        "keyring",
        "kin",
        "model",
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
        # A first hop's tokens are siblings of this one (a copy: no plan made from the original is kept).
        self.model = plan.token.sibling(plan.token.chain)
        # The shared hops from the chains this one makes (bounded as a token's children are).
        self.kin: dict[PlanKey, SharedHop] = {}

    def plan(self, now: float, arrived: ChainToken | None = None) -> Plan | None:
        """The plan of this hop made now, from ``arrived`` (``None``: a first hop); ``None`` when
        the arriving chain's times or the new token's size want a fresh decision."""
        settings = self.settings
        arrival = None
        if arrived is None:
            token = self.model.sibling(start_chain(self.hop, settings.workspace, now, settings.ttl))
            valid_until = now
        else:
            arrival = arrived.chain
            valid_until = arrival.expires_at
            # What policy.integrity checks of a chain's times (the rest is the same for every
            # chain of this path): a chain that expired or comes from the future is decided afresh.
            if now >= valid_until or arrival.issued_at > now + CLOCK_SKEW:
                return None
            token = arrived.extended(self.hop, self.keyring)
            if not token.fits(MAX_TOKEN_LENGTH):
                return None
        token.kin = self.kin
        return Plan(
            self.hop,
            ALLOW,
            token,
            True,
            self.in_force,
            {**self.before, names.CHAIN_ROOT: token.root, **self.after},
            self.span_name,
            self.tally,
            valid_until,
            arrival,
            budgeted=self.budgeted,
        )


class FirstHops:
    """The :class:`SharedHop` of each first hop's key, and of the hops after them (bounded: all
    emptied when ``size`` first hops or ``4 * size`` later ones are kept; ``FirstHops(0)`` keeps
    none, so no later one either; dict operations are atomic)."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._items: dict[PlanKey, SharedHop] = {}
        self._later = 0  # shared hops kept in kin since the last emptying

    def get(self, key: PlanKey, in_force: Settings) -> SharedHop | None:
        first = self._items.get(key)
        return first if first is not None and first.in_force is in_force else None

    def keep(self, key: PlanKey, plan: Plan, settings: Settings) -> None:
        if len(self._items) >= self._size:
            self._items.clear()
            if not self._size:  # FirstHops(0) keeps nothing: every hop is decided (the uncached path)
                return
        self._items[key] = SharedHop(plan, settings)

    def share(self, kin: dict[PlanKey, SharedHop], key: PlanKey, plan: Plan, settings: Settings) -> None:
        """Keep the :class:`SharedHop` of an allowed ``plan`` in a shared hop's ``kin``."""
        if self._later >= 4 * self._size:
            self._later = 0
            self._items.clear()  # the kin of every shared hop goes with them
        if len(kin) < ChainToken.MAX_CHILDREN:
            self._later += 1
            kin[key] = SharedHop(plan, settings)


first_hops = FirstHops()
