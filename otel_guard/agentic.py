"""``@agentic``: every call of an agentic function one guarded hop, whatever kind of function it is.

A sync or async function's call is a :class:`~otel_guard.guard.Delegation`; a generator's hop starts at
its first step and its context is attached around each step only (otel_guard/_steps.py). What a reader
would not guess: a run made directly inside a hop marked joinable under its own name (a service's
request, :func:`~otel_guard.guard.joinable`) makes no Delegation at all: it runs in the joined context,
the request's hop being its hop.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Any, ParamSpec, TypeVar, overload

from opentelemetry import context
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from otel_guard._steps import AsyncEnter, Done, Enter, async_generator_in_context, generator_in_context
from otel_guard.chain import normal_name
from otel_guard.guard import JOINABLE, Delegation, _host_joined, _joined_context

__all__ = ["agentic"]

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")
S = TypeVar("S")


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

        joined_name = _joined_name(hop_name)

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            parent = context.get_current()
            if JOINABLE in parent and _host_joined(parent, joined_name) is not None:
                token = context.attach(_joined_context(parent))  # the hop it runs in is this run's
                try:
                    return fn(*args, **kwargs)
                finally:
                    context.detach(token)
            with Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None):
                return fn(*args, **kwargs)

        return call

    return decorate(fn) if fn is not None else decorate


def _coroutine_hop(
    fn: Callable[..., Awaitable[R]], hop_name: str, skill: str | None
) -> Callable[..., Awaitable[R]]:
    joined_name = _joined_name(hop_name)

    async def call(*args: Any, **kwargs: Any) -> R:
        parent = context.get_current()
        if JOINABLE in parent and _host_joined(parent, joined_name) is not None:
            # The joinable hop it runs directly in is this run's hop (Delegation._join, without
            # making the Delegation that would be a no-op: a run joining a request costs little).
            token = context.attach(_joined_context(parent))
            try:
                return await fn(*args, **kwargs)
            finally:
                context.detach(token)
        async with Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None):
            return await fn(*args, **kwargs)

    return call


def _joined_name(hop_name: str) -> str:
    """The name a hop named ``hop_name`` is compared with a joinable hop's by (the NFKC form
    :class:`Delegation` takes; what is no name joins nothing, and Delegation refuses it at the call)."""
    return normal_name(hop_name) if isinstance(hop_name, str) else ""


def _generator_hop(
    fn: Callable[..., Generator[Y, S, R]], hop_name: str, skill: str | None
) -> Callable[..., Generator[Y, Any, Any]]:
    # A generator's hop starts at its first step and its context is attached around each step only.
    return generator_in_context(_hop_entry(hop_name, skill), fn)


def _async_generator_hop(
    fn: Callable[..., AsyncGenerator[Y, S]], hop_name: str, skill: str | None
) -> Callable[..., AsyncGenerator[Y, Any]]:
    return async_generator_in_context(_async_hop_entry(hop_name, skill), fn)


def _hop_entry(hop_name: str, skill: str | None) -> Enter:
    """What starts a new hop each time a generator made by ``@agentic`` takes its first step."""

    def enter() -> tuple[Context, Done]:
        hop = Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None)
        return hop.start(), hop.finish

    return enter


def _async_hop_entry(hop_name: str, skill: str | None) -> AsyncEnter:
    """:func:`_hop_entry` for an async generator: the hop starts with :meth:`Delegation.astart`."""

    async def enter() -> tuple[Context, Done]:
        hop = Delegation(hop_name, skill, "agent", SpanKind.INTERNAL, False, None)
        return await hop.astart(), hop.finish

    return enter
