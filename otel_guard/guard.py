"""A hop in a process: read the chain, decide, open the span, carry the new chain, run the body.

The chain lives in the OpenTelemetry context, as the W3C baggage member ``otel_guard.chain``. Inside
the process the baggage value is a :class:`~otel_guard.chain.ChainToken` (already verified, signed
only if a propagator injects it); a value that came from a carrier is a string and is verified first.
Because the chain lives in the context, each asyncio task and each thread keeps its own chain (a
thread started inside a hop gets the hop's: otel_guard/_threads.py): parallel branches are never
mistaken for recursion.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Literal, NoReturn

from opentelemetry import baggage, context, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from otel_guard import telemetry as names
from otel_guard._carriers import keep_tokens_out_of_logs
from otel_guard._context_slots import BAGGAGE_SLOT, FAST_CONTEXT, SPAN_SLOT, baggage_of
from otel_guard._in_force import (
    chain_in,
    current_chain,
    name_depth,
    unsigned_token,
    verified_token,
)
from otel_guard._plans import Plan, PlanKey, SharedHop, first_hops
from otel_guard._received_hops import received_hops
from otel_guard._spending import StoreFailed, aspend, spend, spent_message
from otel_guard.budget import MemoryStore, Meter, store_failure, store_for
from otel_guard.chain import (
    MAX_TOKEN_LENGTH,
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    TransferHop,
    check_hop,
    normal_name,
    start_chain,
)
from otel_guard.errors import DelegationRefused
from otel_guard.policy import ALLOW, Verdict, decide_for_agent
from otel_guard.settings import Settings, current_settings

__all__ = [
    "JOINABLE",
    "Delegation",
    "HopKind",
    "chain_in",
    "current_chain",
    "delegate",
    "joinable",
    "name_depth",
]

HopKind = Literal["agent", "tool"]

_log = logging.getLogger("otel_guard")
_BAGGAGE_KEY = names.CHAIN_BAGGAGE_KEY
keep_tokens_out_of_logs()  # every extraction in the process, the guard's and any other's


# -- one hop ------------------------------------------------------------------------------------

_unsigned_warning = threading.Lock()


def _warn_unsigned_once() -> None:
    # The lock is taken once and never released: the first thread to get it warns, no other ever does.
    if _unsigned_warning.acquire(blocking=False):
        _log.warning(
            "otel-guard: no keys configured (OTEL_GUARD_KEYS), so delegation chains are unsigned "
            "and any process on the path can alter them; run `otel-guard keygen` to make a key"
        )


JOINABLE: str = context.create_key("otel_guard.joinable")
"""Context key of a hop that the first agent hop of its own name inside it joins (see :func:`joinable`)."""


_PREVIOUS_HOP: str = context.create_key("otel_guard.previous_hop")
"""Context key of the (span, token) of the hop whose context it is: a hop made directly under that
span, with that token in force, is nested in it (its span leaves the chain's lists out)."""


def joinable(hop: Delegation, ctx: Context) -> Context:
    """``ctx`` (``hop``'s context) marked so that an agent hop named like ``hop`` made directly in it
    is ``hop`` itself, not a second place in the chain.

    A service guarded as agent ``X`` (:class:`otel_guard.asgi.GuardMiddleware`) that runs the agent
    ``X`` is one call: the run joins the request's hop. "Directly" means the chain in force is still
    ``hop``'s: after any hop between, the run is a hop of its own (and a cycle, when it is one).
    """
    return Context({**ctx, JOINABLE: hop})


def _host_joined(parent: Context, agent: str) -> Delegation | None:
    """The hop that an agent hop named ``agent`` made directly in ``parent`` is (:func:`joinable`),
    or ``None`` when it is a hop of its own."""
    host = parent.get(JOINABLE)
    if not isinstance(host, Delegation) or host._agent != agent or (plan := host._plan) is None:
        return None
    members = baggage_of(parent)
    if (members.get(_BAGGAGE_KEY) if members else None) is not (plan.token if plan.carried else None):
        return None  # a hop came between: this one is a hop of its own
    return host


def _joined_context(parent: Context) -> Context:
    """The context a joined hop's body runs in: ``parent`` with the mark used up, so that the same
    name once more inside is a re-entry, and decided as one."""
    return Context({**parent, JOINABLE: None})


_Spent = tuple[Verdict, dict[str, AttributeValue]] | None
"""What a hop's budget check gave it when it went past a budget (observe mode; a store that failed
with ``budget_on_error`` refuse): the verdict that replaces the plan's and the attributes its span
gets. ``None`` otherwise: the tree's hop count, if any, is the hop's ``_hops``."""


class Delegation:
    """One guarded hop. Use :func:`delegate` to make one; enter it with ``with`` or ``async with``.

    ``start()`` / ``finish()`` are the same steps for callers that cannot use a ``with`` block (a
    generator attaches :attr:`context` around each of its steps instead).
    """

    # Not slotted: what a hop sets only when it starts has a class-level default instead (cheaper).
    _hop: Hop | None = None
    _plan: Plan | None = None
    _token: object = None
    _decided_in: Context | None = None
    _spent: _Spent = None
    _hops: int | None = None  # the tree's hops with this one, when max_hops is on (otel_guard.budget.hops)
    _now = 0.0  # when the hop was decided
    _joined = False
    _transfer = False
    span: trace.Span = trace.INVALID_SPAN
    context: Context | None = None
    decision: str | None = None

    def __init__(
        self,
        agent: str,
        skill: str | None,
        kind: HopKind,
        span_kind: SpanKind,
        receiving: bool,
        attributes: Mapping[str, AttributeValue] | None,
        transfer: bool = False,
    ) -> None:
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"delegate: agent must be a non-empty string, not {agent!r}")
        # Names are taken in NFKC form (chain.name_problem says why); check_hop checks them. The
        # ASCII test inline: this runs on every call.
        if not agent.isascii():
            agent = normal_name(agent)
        if isinstance(skill, str) and not skill.isascii():
            skill = normal_name(skill)
        if kind not in ("agent", "tool"):
            raise ValueError(f"delegate: kind must be 'agent' or 'tool', not {kind!r}")
        self._agent = agent
        self._skill = skill
        self._key: PlanKey = (agent, skill, kind)
        if transfer:
            if kind != "agent":
                raise ValueError(f"delegate: a transfer hands control to an agent, not a {kind!r}")
            self._transfer = True
            self._key = (agent, skill, "transfer")  # its plans are not a call's
        self.kind = kind
        self._span_kind = span_kind
        self._receiving = receiving
        self._attributes = attributes

    @property
    def hop(self) -> Hop:
        """The hop (agent, skill); on the receiving side, the one that arrived in the chain."""
        plan = self._plan
        if plan is not None:
            return plan.hop
        hop = self._hop
        if hop is None:
            hop = self._hop = (TransferHop if self._transfer else Hop)(self._agent, self._skill)
        return hop

    @property
    def chain(self) -> Chain | None:
        """The chain including this hop, once it has started (``None`` before)."""
        plan = self._plan
        return plan.token.chain if plan is not None else None

    # The steps ----------------------------------------------------------------------------------

    def start(self) -> Context:
        """Decide the hop and start its span; return the context to run the body in.

        Raises :class:`DelegationRefused` (after recording the refused span) when the hop is refused.
        """
        parent = context.get_current()
        if JOINABLE in parent and (joined := self._join(parent)) is not None:
            return joined
        parent_baggage = baggage_of(parent)
        plan = self._plan_in(parent, parent_baggage)
        if plan.budgeted:
            self._spent = self._spend(plan, parent)
        return self._opened(plan, parent, parent_baggage)

    def decide(self) -> Context:
        """Decide the hop now and start its span later, with :meth:`open`.

        For a runtime whose own tracing makes the span of the call only once the call has begun (a
        LangChain tool run): the hop is checked before the call, and its span goes under the span of
        the call. Returns the context the call runs in until then: the hop's chain in its baggage,
        the current span left as it is. Raises :class:`DelegationRefused` as :meth:`start` does.
        """
        parent = context.get_current()
        if JOINABLE in parent and (joined := self._join(parent)) is not None:
            return joined
        parent_baggage = baggage_of(parent)
        plan = self._plan_in(parent, parent_baggage)
        if plan.budgeted:
            self._spent = self._spend(plan, parent)
        ctx = _with_baggage(parent, plan.child_baggage(parent_baggage))
        self._decided_in = parent
        self.context = ctx
        return ctx

    async def adecide(self) -> Context:
        """:meth:`decide` for async code: a budget store with an asyncio API is awaited, as in
        :meth:`astart`."""
        parent = context.get_current()
        if JOINABLE in parent and (joined := self._join(parent)) is not None:
            return joined
        parent_baggage = baggage_of(parent)
        plan = self._plan_in(parent, parent_baggage)
        if plan.budgeted:
            if plan.settings.budget_store == "memory":  # it never waits: nothing to await
                self._spent = self._spend(plan, parent)
            else:
                self._spent = await self._aspend(plan, parent)
        ctx = _with_baggage(parent, plan.child_baggage(parent_baggage))
        self._decided_in = parent
        self.context = ctx
        return ctx

    def open(self, span_parent: Context | None = None) -> Context:
        """Start the span of a hop :meth:`decide` allowed, under the span current in ``span_parent``
        (default: the context ``decide`` ran in); return the context to run the body in.

        The baggage is the hop's either way: ``span_parent`` chooses the parent span only. Calling it
        again returns the hop's context unchanged.
        """
        if self._joined:
            assert self.context is not None
            return self.context
        plan = self._plan
        decided_in = self._decided_in
        if plan is None or decided_in is None:
            raise RuntimeError("Delegation.open: the hop was not decided (call decide() first)")
        if self.span is not trace.INVALID_SPAN:
            assert self.context is not None
            return self.context
        base = decided_in if span_parent is None else span_parent
        return self._opened(plan, base, baggage_of(decided_in))

    @property
    def opened(self) -> bool:
        """Whether the hop's span has started."""
        return self.span is not trace.INVALID_SPAN

    def _plan_in(self, parent: Context, parent_baggage: Mapping[str, object] | None) -> Plan:
        """The plan of this hop in ``parent``: the one kept on the arriving token, or a new decision."""
        settings = current_settings()  # a plan is kept for these; overrides are applied in _decide
        value = parent_baggage.get(_BAGGAGE_KEY) if parent_baggage else None
        plan = value.children.get(self._key) if type(value) is ChainToken and not self._receiving else None
        self._now = now = time.time()  # the budget's take reads it too
        if plan is None or plan.settings is not settings or now >= plan.valid_until:
            plan = self._decide(value, settings, parent)
        self._plan = plan
        self.decision = plan.verdict.outcome
        return plan

    def _opened(
        self,
        plan: Plan,
        parent: Context,
        parent_baggage: Mapping[str, object] | None,
    ) -> Context:
        """Start the hop's span under ``parent``'s span; ``parent`` with the span and the hop's chain
        (``parent_baggage`` is the baggage the hop was decided in)."""
        verdict = plan.verdict
        spent = self._spent
        # Lean (docs/spec.md §9): the chain's lists are left out when the span goes directly under
        # the span of the hop whose chain this one extends, in that hop's context; its path is then
        # its ancestors'. An arriving hop, and one refused or that would be, keeps them.
        previous = parent.get(_PREVIOUS_HOP)  # (span, token), or None
        if (
            type(previous) is tuple  # the test narrows it, where typing.cast would be a call
            and previous[0] is (parent.get(SPAN_SLOT) if FAST_CONTEXT else trace.get_current_span(parent))
            and previous[1] is (parent_baggage.get(_BAGGAGE_KEY) if parent_baggage else None)
            and verdict.reason is None
            and not self._receiving
            and spent is None
        ):
            attributes = plan.lean_attributes() if plan.lean is None else plan.lean
        else:
            attributes = plan.attributes
        if self._attributes is not None:
            attributes = {**self._attributes, **attributes}
        hops = self._hops
        if hops is not None:
            attributes = {**attributes, names.BUDGET_HOPS: hops}
        tally = plan.tally
        if spent is not None:
            # What, in observe mode, this hop would have been refused for: per hop.
            verdict, spent_attributes = spent
            attributes = {**attributes, **spent_attributes}
            attributes[names.DECISION] = verdict.outcome
            attributes[names.REASON] = verdict.reason or ""
            tally = self._tally_key(verdict, plan.tally[1])
            self.decision = verdict.outcome
        # _open_span's steps, inline (one call fewer on every hop).
        tel = names.current()
        self.span = span = tel.tracer.start_span(plan.span_name, parent, self._span_kind, attributes)
        if verdict.reason is not None:
            _record_verdict(span, verdict)
        tel.hops.add(tally, span)
        # The context in one copy (span and baggage together); the public API's way takes two.
        if FAST_CONTEXT:
            ctx = Context(
                {
                    **parent,
                    SPAN_SLOT: span,
                    BAGGAGE_SLOT: plan.child_baggage(parent_baggage),
                    _PREVIOUS_HOP: (span, plan.token),
                }
            )
        else:
            ctx = _with_baggage(
                context.set_value(_PREVIOUS_HOP, (span, plan.token), trace.set_span_in_context(span, parent)),
                plan.child_baggage(parent_baggage),
            )
        self.context = ctx
        return ctx

    def finish(self, exc: BaseException | None = None) -> None:
        """End the hop's span, recording ``exc`` if the body raised it.

        A hop decided but never opened (the runtime's call never began) gets its span now, under the
        span it was decided under, so no allowed hop goes unrecorded. A hop that joined the one it
        runs in (:func:`joinable`) ends nothing: that hop's span is its owner's to end.
        """
        if self._joined:
            return
        if self._decided_in is not None and self.span is trace.INVALID_SPAN:
            self.open()
        span = self.span
        if exc is not None and span.is_recording():
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute(names.ERROR_TYPE, type(exc).__qualname__)
        span.end()

    # Context managers ---------------------------------------------------------------------------

    def __enter__(self) -> Delegation:
        self._token = context.attach(self.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context.detach(self._token)  # type: ignore[arg-type]
        if exc is None and self._decided_in is None and not self._joined:
            self.span.end()  # all finish() does for a hop started here that ended well
        else:
            self.finish(exc)

    async def __aenter__(self) -> Delegation:
        self._token = context.attach(await self.astart())
        return self

    async def astart(self) -> Context:
        """:meth:`start` for async code: a budget store with an asyncio API (Redis) is awaited, so
        the event loop never waits on its round trip."""
        parent = context.get_current()
        if JOINABLE in parent and (joined := self._join(parent)) is not None:
            return joined
        parent_baggage = baggage_of(parent)
        plan = self._plan_in(parent, parent_baggage)
        if plan.budgeted:
            if plan.settings.budget_store == "memory":  # it never waits: nothing to await
                self._spent = self._spend(plan, parent)
            else:
                self._spent = await self._aspend(plan, parent)
        return self._opened(plan, parent, parent_baggage)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # Internals ----------------------------------------------------------------------------------

    def _join(self, parent: Context) -> Context | None:
        """Join the hop ``parent`` is marked joinable by, when this is an agent hop of its name made
        directly in it (:func:`joinable`); return the context to run the body in, or ``None``.

        A receiving hop joins too: an adapter that took the chain for one its caller sent (LangGraph
        does, when a span of another library's stands between) is inside the same request's hop."""
        if self.kind != "agent" or (host := _host_joined(parent, self._agent)) is None:
            return None
        self._joined = True
        self._plan = host._plan
        self.decision = host.decision
        self.span = host.span
        self.context = ctx = _joined_context(parent)
        return ctx

    def _decide(self, value: object, in_force: Settings, parent: Context) -> Plan:
        """Verify the chain that arrived in ``value``, decide the hop and build its plan.

        A refusal is recorded and raised here; an allowed hop's plan is kept on the token it came
        from, for as long as ``in_force`` (the process-wide settings) stay in force.
        """
        shared: SharedHop | None = None
        made_here = value if type(value) is ChainToken else None
        if value is None:
            shared = first_hops.get(self._key, in_force)
        elif made_here is not None and made_here.kin is not None and not self._receiving:
            # A chain made here from a shared hop: the next hop from its path may be shared too.
            shared = made_here.kin.get(self._key)
            if shared is not None and shared.in_force is not in_force:
                shared = None
        if shared is not None:
            plan = shared.plan(time.time(), made_here)
            if plan is not None:
                if made_here is not None:
                    made_here.remember(self._key, plan)
                self._hop = plan.hop
                return plan
        hop = self.hop
        check_hop(hop)
        settings = in_force.for_agent(hop.agent)
        keyring = settings.keys
        if keyring is None:
            _warn_unsigned_once()
        now = time.time()
        unsigned = None  # an unsigned chain accept_unsigned takes: why enforce would refuse it
        try:
            arrived = verified_token(value, keyring)
        except InvalidToken as exc:
            arrived = unsigned_token(value, settings)  # None: refused, or in off mode a new chain
            if arrived is not None:
                unsigned = (
                    f"Delegation chain failed verification: {exc}; agent {hop.agent} would be refused "
                    "(accept_unsigned took the chain as it arrived)"
                )
            elif settings.mode != "off":
                message = f"Delegation chain failed verification: {exc}; agent {hop.agent} refused"
                verdict = Verdict("refuse", "bad_signature", message)
                self._refuse(
                    verdict,
                    None,
                    ChainToken(Chain((hop,), "", settings.workspace, now, now), None),
                    parent,
                    settings,
                )
        arrival = arrived.chain if arrived is not None else None
        memo = None
        counted_by_caller = False
        if self._receiving and arrived is not None and arrival is not None and _continues(arrival, hop):
            counted_by_caller = True
            # The caller's instrumentation already added this hop: check it again, do not add it
            # twice (its budgets are checked, and its tree's count claimed: see otel_guard._spending).
            hop = self._hop = arrival.hops[-1]
            before = Chain(
                arrival.hops[:-1], arrival.root, arrival.workspace, arrival.issued_at, arrival.expires_at
            )
            verdict = decide_for_agent(before, hop, settings, now)
            token = arrived
        elif arrived is None:
            verdict = decide_for_agent(None, hop, settings, now)
            token = ChainToken(start_chain(hop, settings.workspace, now, settings.ttl), keyring)
        else:
            if self._receiving and unsigned is None:
                # A service's hop from a path it was allowed from: made again, not decided.
                shared_plan = received_hops.plan(self._key, arrived, in_force, settings, now)
                if shared_plan is not None:
                    arrived.remember(self._key, shared_plan)
                    return shared_plan
            verdict = decide_for_agent(arrival, hop, settings, now)
            token = arrived.extended(hop, keyring)
            memo = arrived
        if verdict.outcome == "refuse":
            self._refuse(verdict, arrival, token, parent, settings)
        carried = token.fits(MAX_TOKEN_LENGTH)
        if not carried and settings.mode != "off":
            verdict = Verdict(
                "refuse",
                "chain_size",
                f"Delegation chain too large: calling agent {hop.agent} would make a token of "
                f"{token.length} bytes, over the W3C baggage limit of {MAX_TOKEN_LENGTH}",
            )
            self._refuse(verdict, arrival, token, parent, settings)
        budgeted = verdict.outcome == "allow" and settings.mode != "off" and in_force.budgets_on
        if unsigned is not None and verdict.outcome == "allow" and settings.mode != "off":
            # Taken, and counted, as it arrived; recorded as what it would be without accept_unsigned
            # (a policy would-refuse, a cycle in observe mode, keeps its own reason). Never ALLOW,
            # so never a shared plan.
            verdict = Verdict("would_refuse", "bad_signature", unsigned)
        plan = Plan(
            hop,
            verdict,
            token,
            carried,
            in_force,
            self._attributes_for(verdict, token, settings),
            self._span_name(),
            self._tally_key(verdict, len(token.agents)),
            arrival.expires_at if arrival is not None else now,
            arrival,
            budgeted=budgeted,
            received=counted_by_caller,
        )
        if memo is not None:
            memo.remember(self._key, plan)
            if memo.kin is not None and verdict is ALLOW and carried and not self._receiving:
                first_hops.share(memo.kin, self._key, plan, settings)
            elif self._receiving and verdict is ALLOW and carried:
                received_hops.keep(self._key, plan, settings)
        elif value is None and verdict is ALLOW and carried:
            first_hops.keep(self._key, plan, settings)
        return plan

    def _spend(self, plan: Plan, parent: Context) -> _Spent:
        """Count this hop against its tree's and its workspace's budgets (a received hop: check it,
        and claim it: :mod:`otel_guard._spending`).

        Keeps the tree's count for the hop's span (``otel_guard.budget.hops``); returns, in observe
        mode, the would-refuse verdict of a spent budget; a spent budget in enforce mode is a refusal,
        recorded and raised here. Nothing is counted for a hop that goes past a budget.
        """
        store = store_for(plan.settings)
        alone = plan.alone
        if alone is not None and type(store) is MemoryStore:
            # The common case: one lock, one dict lookup, nothing made.
            count = store.take_hop(alone, self._now)
            if count < 0:
                return self._taken(plan, parent, plan.meters, 0)
            if alone[1]:
                self._hops = count
            return None
        try:
            meters, taken = spend(store, plan.meters, plan.settings, plan.received)
        except StoreFailed as failed:  # the store's failure never becomes the hop's
            return self._store_failed(plan, parent, failed)
        return self._taken(plan, parent, meters, taken)

    async def _aspend(self, plan: Plan, parent: Context) -> _Spent:
        """:meth:`_spend`, awaiting a store that has an asyncio API."""
        try:
            meters, taken = await aspend(store_for(plan.settings), plan.meters, plan.settings, plan.received)
        except StoreFailed as failed:
            return self._store_failed(plan, parent, failed)
        return self._taken(plan, parent, meters, taken)

    def _taken(
        self, plan: Plan, parent: Context, meters: tuple[Meter, ...], taken: tuple[int, ...] | int
    ) -> _Spent:
        if isinstance(taken, int):
            meter = meters[taken]
            message = spent_message(plan.settings, plan.token.root, plan.hop.agent, meter, plan.received)
            return self._over_budget(plan, parent, message, meter.budget)
        # The tree's count comes first (with max_hops on: the span's otel_guard.budget.hops).
        if plan.meters[0].limit:
            self._hops = taken[0]
        return None

    def _store_failed(self, plan: Plan, parent: Context, failed: StoreFailed) -> _Spent:
        names.count_store_error(failed.error)
        if plan.settings.budget_on_error == "allow":
            return None
        message = (
            f"Delegation budget: {store_failure(failed.error)} and budget_on_error is refuse; "
            f"agent {plan.hop.agent} refused"
        )
        return self._over_budget(plan, parent, message, failed.meters[0].budget)

    def _over_budget(
        self, plan: Plan, parent: Context, message: str, budget: str
    ) -> tuple[Verdict, dict[str, AttributeValue]]:
        """The refusal (enforce) or would-refuse (observe) of a hop past a budget."""
        exhausted: dict[str, AttributeValue] = {names.BUDGET_EXHAUSTED: budget}
        settings = plan.settings.for_agent(plan.hop.agent)
        if settings.mode != "observe":
            verdict = Verdict("refuse", "budget", message)
            self._refuse(verdict, plan.arrival, plan.token, parent, settings, exhausted)
        return Verdict("would_refuse", "budget", message), exhausted

    def _span_name(self) -> str:
        return f"{names.EXECUTE_TOOL if self.kind == 'tool' else names.INVOKE_AGENT} {self._agent}"

    def _tally_key(self, verdict: Verdict, depth: int) -> names.HopKey:
        name_key = names.GEN_AI_TOOL_NAME if self.kind == "tool" else names.GEN_AI_AGENT_NAME
        return (verdict.outcome, verdict.reason, name_key, self._agent), depth

    def _attributes_for(
        self, verdict: Verdict, token: ChainToken, settings: Settings
    ) -> dict[str, AttributeValue]:
        """The span attributes of docs/spec.md §5 (the guard's own only)."""
        hop = self.hop
        agents = token.agents
        tool = self.kind == "tool"
        attributes: dict[str, AttributeValue] = {
            names.GEN_AI_OPERATION_NAME: names.EXECUTE_TOOL if tool else names.INVOKE_AGENT,
            names.GEN_AI_TOOL_NAME if tool else names.GEN_AI_AGENT_NAME: hop.agent,
            # Lists, not the token's tuples: the SDK stores either as a tuple, and its check of a
            # list is an ABC cache hit where a tuple's is a miss (measured: 2.4 k instructions each).
            names.CHAIN_AGENTS: list(agents),
            names.CHAIN_SKILLS: list(token.skills),
            names.CHAIN_DEPTH: len(agents),
            names.NAME_DEPTH: agents.count(hop.agent),
            names.DECISION: verdict.outcome,
            names.MODE: settings.mode,
            names.HOP_KIND: hop.kind,
        }
        if type(hop) is TransferHop:
            attributes[names.GEN_AI_TRANSFER_MODE] = names.PASS_CONTROL
        if token.root:
            attributes[names.CHAIN_ROOT] = token.root
        if hop.skill is not None:
            attributes[names.SKILL] = hop.skill
        if verdict.reason is not None:
            attributes[names.REASON] = verdict.reason
        return attributes

    def _open_span(
        self,
        name: str,
        parent: Context,
        attributes: Mapping[str, AttributeValue],
        verdict: Verdict,
        tally: names.HopKey,
    ) -> trace.Span:
        tel = names.current()
        span = tel.tracer.start_span(name, parent, self._span_kind, attributes)
        if verdict.reason is not None:
            _record_verdict(span, verdict)
        tel.hops.add(tally, span)  # a refusal's exemplar: the refused hop's own span
        return span

    def _refuse(
        self,
        verdict: Verdict,
        arrival: Chain | None,
        token: ChainToken,
        parent: Context,
        settings: Settings,
        extra: Mapping[str, AttributeValue] | None = None,
    ) -> NoReturn:
        attributes = self._attributes_for(verdict, token, settings)
        if self._attributes:
            attributes = {**self._attributes, **attributes}
        if extra:
            attributes.update(extra)
        tally = self._tally_key(verdict, len(token.agents))
        span = self._open_span(self._span_name(), parent, attributes, verdict, tally)
        span.set_status(Status(StatusCode.ERROR, verdict.message))
        span.set_attribute(names.ERROR_TYPE, DelegationRefused.__name__)
        span.end()
        self.decision = "refuse"
        assert verdict.reason is not None
        raise DelegationRefused(verdict.reason, verdict.message, self.hop, arrival)


def _record_verdict(span: trace.Span, verdict: Verdict) -> None:
    """The span event of a refused or would-refuse hop."""
    span.add_event(
        names.EVENT_REFUSED if verdict.outcome == "refuse" else names.EVENT_WOULD_REFUSE,
        {names.REASON: verdict.reason or "", names.EVENT_MESSAGE: verdict.message},
    )


def _with_baggage(ctx: Context, hop_baggage: Mapping[str, object]) -> Context:
    """``ctx`` with ``hop_baggage`` as its baggage, whatever baggage ``ctx`` had (a decided hop before
    its span starts; through the public API, a hop's context: its span's parent context may be
    another than the one it was decided in, :meth:`Delegation.open`)."""
    if FAST_CONTEXT:
        return Context({**ctx, BAGGAGE_SLOT: hop_baggage})
    ctx = baggage.clear(ctx)
    for key, value in hop_baggage.items():
        ctx = baggage.set_baggage(key, value, ctx)
    return ctx


def _continues(arrival: Chain, hop: Hop) -> bool:
    """Whether ``arrival`` already ends with ``hop`` (a skill of ``None`` on either side matches)."""
    last = arrival.hops[-1]
    return last.agent == hop.agent and (hop.skill is None or last.skill is None or last.skill == hop.skill)


def delegate(
    agent: str,
    skill: str | None = None,
    *,
    kind: HopKind = "agent",
    span_kind: SpanKind = SpanKind.INTERNAL,
    receiving: bool = False,
    attributes: Mapping[str, AttributeValue] | None = None,
    transfer: bool = False,
) -> Delegation:
    """One guarded hop into ``agent`` (for ``skill``), as a ``with`` or ``async with`` block.

    The hop is checked on entry: in enforce mode a refused hop raises :class:`DelegationRefused` and
    the body never runs. ``kind="tool"`` makes an ``execute_tool`` span. ``receiving=True`` is the
    server side of a remote hop: when the chain that arrived already ends with this agent, that hop is
    checked again instead of being added twice.

    ``transfer=True``: a handoff (the current agent passes control and waits for no answer; a return
    to it is no cycle: policy.waiting), only where the runtime's own handoff API says so.
    """
    return Delegation(agent, skill, kind, span_kind, receiving, attributes, transfer)
