"""A hop in a process: read the chain, decide, open the span, carry the new chain, run the body.

The chain lives in the OpenTelemetry context, as the W3C baggage member ``otel_guard.chain``. Inside
the process the baggage value is a :class:`~otel_guard.chain.ChainToken` (already verified, signed
only if a propagator injects it); a value that came from a carrier is a string and is verified first.
Because the chain lives in the context, each asyncio task and each thread started with a copied
context keeps its own chain: parallel branches are never mistaken for recursion.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, Literal, NoReturn, ParamSpec, TypeVar, overload

from opentelemetry import baggage, context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from otel_guard import telemetry as names
from otel_guard._steps import Done, Enter, async_generator_in_context, generator_in_context
from otel_guard.chain import (
    MAX_TOKEN_LENGTH,
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    decode,
    start_chain,
)
from otel_guard.errors import DelegationRefused
from otel_guard.policy import Settings, Verdict, current_settings, decide

HopKind = Literal["agent", "tool"]

_log = logging.getLogger("otel_guard")
_BAGGAGE_KEY = names.CHAIN_BAGGAGE_KEY

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")
S = TypeVar("S")


# -- reading the chain in force -----------------------------------------------------------------


class _VerifiedTokens:
    """Tokens from carriers that this process has verified already, by (keyring, token).

    A server reads the same incoming token more than once (``current_chain()``, then the hop): the
    second read is a dict lookup. Bounded (emptied when full); only successful verifications are kept.
    Plain dict operations are atomic under the GIL, so no lock is needed.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._items: dict[tuple[Keyring | None, str], Chain] = {}

    def verify(self, token: str, keyring: Keyring | None) -> Chain:
        key = (keyring, token)
        chain = self._items.get(key)
        if chain is None:
            chain = decode(token, keyring)
            if len(self._items) >= self._size:
                self._items.clear()
            self._items[key] = chain
        return chain


_verified = _VerifiedTokens()


def _arrival(ctx: context.Context | None, keyring: Keyring | None) -> ChainToken | None:
    """The chain in ``ctx``; raises :class:`InvalidToken` for one that fails verification."""
    value = baggage.get_baggage(_BAGGAGE_KEY, ctx)
    if value is None or type(value) is ChainToken:
        return value
    if not isinstance(value, str):
        raise InvalidToken("baggage member otel_guard.chain is not a token")
    return ChainToken(_verified.verify(value, keyring), keyring, value)


def current_chain() -> Chain | None:
    """The verified chain in force in the current context, or ``None`` outside any hop."""
    try:
        token = _arrival(None, current_settings().keys)
    except InvalidToken:
        return None
    return token.chain if token is not None and token.chain.hops else None


def name_depth(name: str) -> int:
    """How many times ``name`` stands in the current chain (0 outside any hop)."""
    chain = current_chain()
    return chain.name_depth(name) if chain is not None else 0


# -- one hop ------------------------------------------------------------------------------------

_unsigned_warning = threading.Lock()


def _warn_unsigned_once() -> None:
    # The lock is taken once and never released: the first thread to get it warns, no other ever does.
    if _unsigned_warning.acquire(blocking=False):
        _log.warning(
            "otel-guard: no keys configured (OTEL_GUARD_KEYS), so delegation chains are unsigned "
            "and any process on the path can alter them; run `otel-guard keygen` to make a key"
        )


class Delegation:
    """One guarded hop. Use :func:`delegate` to make one; enter it with ``with`` or ``async with``.

    ``start()`` / ``finish()`` are the same steps for callers that cannot use a ``with`` block (a
    generator attaches :attr:`context` around each of its steps instead).
    """

    __slots__ = (
        "_attributes",
        "_receiving",
        "_span_kind",
        "_token",
        "chain",
        "context",
        "decision",
        "hop",
        "kind",
        "span",
    )

    def __init__(
        self,
        agent: str,
        skill: str | None,
        kind: HopKind,
        span_kind: SpanKind,
        receiving: bool,
        attributes: Mapping[str, AttributeValue] | None,
    ) -> None:
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"delegate: agent must be a non-empty string, not {agent!r}")
        if kind not in ("agent", "tool"):
            raise ValueError(f"delegate: kind must be 'agent' or 'tool', not {kind!r}")
        self.hop = Hop(agent, skill)
        self.kind = kind
        self._span_kind = span_kind
        self._receiving = receiving
        self._attributes = attributes
        self._token: object = None
        self.span: trace.Span = trace.INVALID_SPAN
        self.chain: Chain | None = None
        self.context: context.Context | None = None
        self.decision: str | None = None

    # The steps ----------------------------------------------------------------------------------

    def start(self) -> context.Context:
        """Decide the hop and start its span; return the context to run the body in.

        ``settings`` below are the ones in force for this hop's agent (overrides applied).

        Raises :class:`DelegationRefused` (after recording the refused span) when the hop is refused.
        """
        hop = self.hop
        settings = current_settings().for_agent(hop.agent)
        keyring = settings.keys
        attributes: dict[str, AttributeValue] | None = None
        if keyring is None:
            _warn_unsigned_once()
        parent = context.get_current()
        now = time.time()
        try:
            arrived = _arrival(parent, keyring)
        except InvalidToken as exc:
            if settings.mode != "off":
                message = f"Delegation chain failed verification: {exc}; agent {hop.agent} refused"
                verdict = Verdict("refuse", "bad_signature", message)
                self._refuse(verdict, None, Chain((hop,), "", settings.workspace, now, now), parent, settings)
            arrived = None  # off mode: no checks; the hop starts a new chain
        arrival = arrived.chain if arrived is not None else None
        if self._receiving and arrived is not None and arrival and _continues(arrival, hop):
            # The caller's instrumentation already added this hop: check it again, do not add it twice.
            hop = self.hop = arrival.hops[-1]
            before = Chain(
                arrival.hops[:-1], arrival.root, arrival.workspace, arrival.issued_at, arrival.expires_at
            )
            verdict = decide(before, hop, settings, now)
            token = arrived
        elif arrived is not None and arrival is not None and self._attributes is None:
            # The same hop from the same chain (an agent calling one tool again and again) decides the
            # same way and makes the same child chain while the settings and the clock allow: reuse.
            child = arrived.children.get((hop, self.kind))
            if child is not None and child[0] is settings and now < arrival.expires_at:
                _, verdict, token, attributes = child
            else:
                verdict = decide(arrival, hop, settings, now)
                token = arrived.extended(hop, keyring)
                attributes = self._attributes_for(verdict, token.chain, settings, token)
                if verdict.outcome != "refuse":
                    arrived.remember((hop, self.kind), (settings, verdict, token, attributes))
        else:
            verdict = decide(arrival, hop, settings, now)
            if arrived is None:
                token = ChainToken(start_chain(hop, settings.workspace, now, settings.ttl), keyring)
            else:
                token = arrived.extended(hop, keyring)
        chain = token.chain
        if verdict.outcome == "refuse":
            self._refuse(verdict, arrival, chain, parent, settings)
        oversized = token.length > MAX_TOKEN_LENGTH
        if oversized and settings.mode != "off":
            verdict = Verdict(
                "refuse",
                "chain_size",
                f"Delegation chain too large: calling agent {hop.agent} would make a token of "
                f"{token.length} bytes, over the W3C baggage limit of {MAX_TOKEN_LENGTH}",
            )
            self._refuse(verdict, arrival, chain, parent, settings)
        if attributes is None:
            attributes = self._attributes_for(verdict, chain, settings, token)
        span = self._start_span(verdict, parent, attributes, chain.depth)
        self.span = span
        self.chain = chain
        self.decision = verdict.outcome
        ctx = trace.set_span_in_context(span, parent)
        # A token the propagator would drop is never produced: in off mode such a hop carries no chain.
        ctx = (
            baggage.remove_baggage(_BAGGAGE_KEY, ctx)
            if oversized
            else baggage.set_baggage(_BAGGAGE_KEY, token, ctx)
        )
        self.context = ctx
        return ctx

    def finish(self, exc: BaseException | None = None) -> None:
        """End the hop's span, recording ``exc`` if the body raised it."""
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
        self.finish(exc)

    async def __aenter__(self) -> Delegation:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # Internals ----------------------------------------------------------------------------------

    def _attributes_for(
        self, verdict: Verdict, chain: Chain, settings: Settings, token: ChainToken | None = None
    ) -> dict[str, AttributeValue]:
        hop = self.hop
        agents = token.agents if token is not None else chain.agents
        tool = self.kind == "tool"
        # The caller's attributes go first so they can never overwrite the guard's own.
        attributes: dict[str, AttributeValue] = dict(self._attributes) if self._attributes else {}
        attributes |= {
            names.GEN_AI_OPERATION_NAME: names.EXECUTE_TOOL if tool else names.INVOKE_AGENT,
            names.GEN_AI_TOOL_NAME if tool else names.GEN_AI_AGENT_NAME: hop.agent,
            names.CHAIN_AGENTS: agents,
            names.CHAIN_SKILLS: token.skills if token is not None else chain.skills,
            names.CHAIN_DEPTH: len(agents),
            names.NAME_DEPTH: agents.count(hop.agent),
            names.DECISION: verdict.outcome,
            names.MODE: settings.mode,
        }
        if chain.root:
            attributes[names.CHAIN_ROOT] = chain.root
        if hop.skill is not None:
            attributes[names.SKILL] = hop.skill
        if verdict.reason is not None:
            attributes[names.REASON] = verdict.reason
        return attributes

    def _start_span(
        self,
        verdict: Verdict,
        parent: context.Context,
        attributes: dict[str, AttributeValue],
        depth: int,
    ) -> trace.Span:
        tel = names.current()
        tool = self.kind == "tool"
        span = tel.tracer.start_span(
            f"{names.EXECUTE_TOOL if tool else names.INVOKE_AGENT} {self.hop.agent}",
            context=parent,
            kind=self._span_kind,
            attributes=attributes,
        )
        if verdict.reason is not None:
            span.add_event(
                names.EVENT_REFUSED if verdict.outcome == "refuse" else names.EVENT_WOULD_REFUSE,
                {names.REASON: verdict.reason, names.EVENT_MESSAGE: verdict.message},
            )
        tel.decisions.add(
            (
                verdict.outcome,
                verdict.reason,
                names.GEN_AI_TOOL_NAME if tool else names.GEN_AI_AGENT_NAME,
                self.hop.agent,
            )
        )
        tel.depths.add(depth)
        return span

    def _refuse(
        self,
        verdict: Verdict,
        arrival: Chain | None,
        chain: Chain,
        parent: context.Context,
        settings: Settings,
    ) -> NoReturn:
        span = self._start_span(verdict, parent, self._attributes_for(verdict, chain, settings), chain.depth)
        span.set_status(Status(StatusCode.ERROR, verdict.message))
        span.set_attribute(names.ERROR_TYPE, DelegationRefused.__name__)
        span.end()
        self.decision = "refuse"
        assert verdict.reason is not None
        raise DelegationRefused(verdict.reason, verdict.message, self.hop, arrival)


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
) -> Delegation:
    """One guarded hop into ``agent`` (for ``skill``), as a ``with`` or ``async with`` block.

    The hop is checked on entry: in enforce mode a refused hop raises :class:`DelegationRefused` and
    the body never runs. ``kind="tool"`` makes an ``execute_tool`` span. ``receiving=True`` is the
    server side of a remote hop: when the chain that arrived already ends with this agent, that hop is
    checked again instead of being added twice.
    """
    return Delegation(agent, skill, kind, span_kind, receiving, attributes)


# -- @agentic -----------------------------------------------------------------------------------


@overload
def agentic(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def agentic(
    *, name: str | None = None, skill: str | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def agentic(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    skill: str | None = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
    """Make every call of an agentic function one guarded hop.

    ``@agentic`` or ``@agentic(name=..., skill=...)``. The name defaults to the function's
    ``tool_name`` attribute, else its ``__name__``. Works on sync and async functions and on sync and
    async generator functions (a generator's hop starts at its first step and ends when it is done).
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        hop_name = name or getattr(fn, "tool_name", None) or fn.__name__
        if inspect.isasyncgenfunction(fn):
            return functools.wraps(fn)(_async_generator_hop(fn, hop_name, skill))  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return functools.wraps(fn)(_generator_hop(fn, hop_name, skill))  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):
            return functools.wraps(fn)(_coroutine_hop(fn, hop_name, skill))  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            with Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None):
                return fn(*args, **kwargs)

        return call

    return decorate(fn) if fn is not None else decorate


def _coroutine_hop(
    fn: Callable[..., Awaitable[R]], hop_name: str, skill: str | None
) -> Callable[..., Awaitable[R]]:
    async def call(*args: Any, **kwargs: Any) -> R:
        with Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None):
            return await fn(*args, **kwargs)

    return call


def _generator_hop(
    fn: Callable[..., Generator[Y, S, R]], hop_name: str, skill: str | None
) -> Callable[..., Generator[Y, Any, Any]]:
    # A generator's hop starts at its first step and its context is attached around each step only.
    return generator_in_context(_hop_entry(hop_name, skill), fn)


def _async_generator_hop(
    fn: Callable[..., AsyncGenerator[Y, S]], hop_name: str, skill: str | None
) -> Callable[..., AsyncGenerator[Y, Any]]:
    return async_generator_in_context(_hop_entry(hop_name, skill), fn)


def _hop_entry(hop_name: str, skill: str | None) -> Enter:
    """What starts a new hop each time a generator made by ``@agentic`` takes its first step."""

    def enter() -> tuple[context.Context, Done]:
        hop = Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None)
        return hop.start(), hop.finish

    return enter
