"""A hop around a streamed graph run: one span for the whole stream, its context around each step.

LangGraph runs a graph as a generator (``Pregel.stream`` / ``astream``; ``invoke`` and ``ainvoke``
consume them). The hop starts at the stream's first step, its context is attached around each step
only, and it ends when the stream ends, fails or is closed (see :mod:`otel_guard._steps`, which runs
every generator hop of the package). The consumer never sees the hop's context.

``enter`` decides where the run stands (a new hop, a hop it joins, a hop that arrived from another
process, a transfer a handoff decided) and returns the context to run the steps in, with the
:class:`~otel_guard.guard.Delegation` to finish at the end (``None`` when the run joined a hop that
someone else finishes, or is no hop: an unnamed graph). Every run's steps also hold its
:class:`~._handoffs.Handoffs`, ended with it.

``invoke`` / ``ainvoke`` (the usual call) are a hop of their own around the whole call
(:func:`invoke_in_hop`): its context is attached once, not around each of the stream's steps (two
context switches a step, 8 a one-tool run), and the stream that ``invoke`` runs is told by an
:class:`Invoking` mark in that context that it is already inside its hop.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import Any, Final, TypeVar

from opentelemetry import context

from otel_guard._steps import Done, async_generator_in_context, generator_in_context
from otel_guard.guard import Delegation
from otel_guard.instrumentation.langgraph._handoffs import Handoffs, in_run
from otel_guard.instrumentation.langgraph._waiting import finish

Y = TypeVar("Y")

R = TypeVar("R")

INVOKING: Final = context.create_key("otel_guard.langgraph.invoking")
"""Context key of the :class:`Invoking` mark of a graph's ``invoke`` whose stream has not begun."""

StepContext = tuple[context.Context, Delegation | None]
"""The context a stream's steps run in, and the hop to finish when the stream is done (if any).

A hop that was only decided (:meth:`Delegation.decide`) starts its span during the first step, when
the graph's run begins; the steps after it run in the hop's context from then on.
"""


def stream_in_hop(
    enter: Callable[[], StepContext], make: Callable[[], Iterator[Y]]
) -> Generator[Y, Any, Any]:
    """Iterate ``make()`` with the context ``enter()`` returns attached around every step.

    ``enter`` runs at the first step (a generator does nothing until it is iterated) and may raise
    :class:`~otel_guard.errors.DelegationRefused`; then ``make`` is never called.
    """
    steps = _Steps(enter)
    return generator_in_context(steps.enter, make, steps.moved)()


def astream_in_hop(
    enter: Callable[[], Awaitable[StepContext]], make: Callable[[], AsyncIterator[Y]]
) -> AsyncGenerator[Y, Any]:
    """The ``async`` form of :func:`stream_in_hop`: ``await enter()`` at the first step."""
    steps = _AsyncSteps(enter)
    return async_generator_in_context(steps.enter, make, steps.moved)()


class Invoking:
    """Marks the context of a graph's ``invoke`` hop until the stream it runs takes the mark: that
    stream (the graph's first, called at once by ``invoke``) runs as it is, inside the hop."""

    __slots__ = ("graph",)

    def __init__(self, graph: object) -> None:
        self.graph: object = graph


def invoked(graph: object) -> bool:
    """Whether this stream of ``graph`` is the one its ``invoke`` runs (the mark is taken: any later
    stream of the same graph in that run, a graph that runs itself, is a hop of its own)."""
    mark = context.get_current().get(INVOKING)
    if type(mark) is Invoking and mark.graph is graph:
        mark.graph = None
        return True
    return False


def invoke_in_hop(enter: Callable[[], StepContext], graph: object, call: Callable[[], R]) -> R:
    """``call()`` (a graph's ``invoke``) in the hop ``enter()`` opens, its context attached around it
    once; the hop ends with the call. Raises what ``enter`` raises (a refused hop) before the call."""
    steps = _Steps(enter)
    ctx, done = steps.enter()
    token = context.attach(context.Context({**ctx, INVOKING: Invoking(graph)}))
    try:
        result = call()
    except BaseException as exc:
        done(exc)
        raise
    finally:
        # The hop's span, if it opened during the call, was attached inside it: this resets both.
        context.detach(token)
    done(None)
    return result


async def ainvoke_in_hop(
    enter: Callable[[], Awaitable[StepContext]], graph: object, call: Callable[[], Awaitable[R]]
) -> R:
    """:func:`invoke_in_hop` for ``ainvoke``: ``await enter()``, then ``await call()``."""
    steps = _AsyncSteps(enter)
    ctx, done = await steps.enter()
    token = context.attach(context.Context({**ctx, INVOKING: Invoking(graph)}))
    try:
        result = await call()
    except BaseException as exc:
        done(exc)
        raise
    finally:
        context.detach(token)
    done(None)
    return result


class _Moving:
    """Ends the hop a stream opened when the stream is done (nothing for a joined hop), and moves the
    steps into the hop's context once a hop that was only decided has started its span."""

    __slots__ = ("_hop",)

    def __init__(self) -> None:
        self._hop: Delegation | None = None

    def _entered(self, step_context: StepContext) -> tuple[context.Context, Done]:
        ctx, hop = step_context
        ctx, handoffs = in_run(ctx)
        if hop is None:
            return ctx, handoffs.close
        if not hop.opened:  # decided only: its span waits for the graph's run
            self._hop = hop
        return ctx, functools.partial(_finish, handoffs, hop)

    def moved(self) -> context.Context | None:
        hop = self._hop
        if hop is None or not hop.opened:
            return None
        self._hop = None
        return hop.context


class _Steps(_Moving):
    """The ``enter`` of a stream's steps (see :class:`_Moving`)."""

    __slots__ = ("_enter",)

    def __init__(self, enter: Callable[[], StepContext]) -> None:
        super().__init__()
        self._enter = enter

    def enter(self) -> tuple[context.Context, Done]:
        return self._entered(self._enter())


class _AsyncSteps(_Moving):
    """:class:`_Steps` for an async stream: its ``enter`` is awaited."""

    __slots__ = ("_enter",)

    def __init__(self, enter: Callable[[], Awaitable[StepContext]]) -> None:
        super().__init__()
        self._enter = enter

    async def enter(self) -> tuple[context.Context, Done]:
        return self._entered(await self._enter())


def _finish(handoffs: Handoffs, hop: Delegation, exc: BaseException | None) -> None:
    """End the run's transfers that no node took, then its hop (their spans' parent, if opened)."""
    handoffs.close()
    finish(hop, exc)
