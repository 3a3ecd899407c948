"""A hop around a streamed graph run: one span for the whole stream, its context around each step.

LangGraph runs a graph as a generator (``Pregel.stream`` / ``astream``; ``invoke`` and ``ainvoke``
consume them). A hop around a generator cannot simply be a ``with`` block inside it: the block would
attach the hop's context when the generator starts and keep it attached in the *consumer's* context
between chunks, and a generator closed from elsewhere (early ``break``, garbage collection) would
detach it in the wrong context. So the hop starts at the first step, its context is attached around
each step only (and detached in the same step, as ``contextvars`` require), and it ends when the
stream ends, fails or is closed. The consumer never sees the hop's context.

``enter`` decides where the run stands (a new hop, a hop it joins, a hop that arrived from another
process) and returns the context to run the steps in, with the :class:`~otel_guard.guard.Delegation`
to finish at the end (``None`` when the run joined a hop that someone else finishes).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import TypeVar

from opentelemetry import context

from otel_guard.guard import Delegation

Y = TypeVar("Y")

StepContext = tuple[context.Context, Delegation | None]
"""The context a stream's steps run in, and the hop to finish when the stream is done (if any)."""


def _finish(hop: Delegation | None, exc: BaseException | None = None) -> None:
    if hop is not None:
        hop.finish(exc)


def stream_in_hop(
    enter: Callable[[], StepContext], make: Callable[[], Iterator[Y]]
) -> Generator[Y, None, None]:
    """Iterate ``make()`` with the context ``enter()`` returns attached around every step.

    ``enter`` runs at the first step (a generator does nothing until it is iterated) and may raise
    :class:`~otel_guard.errors.DelegationRefused`; then ``make`` is never called.
    """
    ctx, hop = enter()
    token = context.attach(ctx)
    try:
        inner = make()
    except BaseException as exc:
        _finish(hop, exc)
        raise
    finally:
        context.detach(token)
    try:
        while True:
            token = context.attach(ctx)
            try:
                item = next(inner)
            except StopIteration:
                break
            finally:
                context.detach(token)
            yield item
    except GeneratorExit:
        # The consumer stopped early: close the graph's stream under the hop, then end the hop.
        _close(inner, ctx)
        _finish(hop)
        raise
    except BaseException as exc:
        # The graph failed, or the consumer threw into the stream: the graph's stream ends either way.
        _close(inner, ctx)
        _finish(hop, exc)
        raise
    _finish(hop)


def _close(inner: Iterator[object], ctx: context.Context) -> None:
    close = getattr(inner, "close", None)
    if close is not None:
        token = context.attach(ctx)
        try:
            close()
        finally:
            context.detach(token)


async def astream_in_hop(
    enter: Callable[[], StepContext], make: Callable[[], AsyncIterator[Y]]
) -> AsyncGenerator[Y, None]:
    """The ``async`` form of :func:`stream_in_hop`."""
    ctx, hop = enter()
    token = context.attach(ctx)
    try:
        inner = make()
    except BaseException as exc:
        _finish(hop, exc)
        raise
    finally:
        context.detach(token)
    try:
        while True:
            token = context.attach(ctx)
            try:
                item = await anext(inner)
            except StopAsyncIteration:
                break
            finally:
                context.detach(token)
            yield item
    except GeneratorExit:
        await _aclose(inner, ctx)
        _finish(hop)
        raise
    except BaseException as exc:
        await _aclose(inner, ctx)
        _finish(hop, exc)
        raise
    _finish(hop)


async def _aclose(inner: AsyncIterator[object], ctx: context.Context) -> None:
    aclose = getattr(inner, "aclose", None)
    if aclose is not None:
        token = context.attach(ctx)
        try:
            await aclose()
        finally:
            context.detach(token)
