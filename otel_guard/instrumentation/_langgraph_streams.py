"""A hop around a streamed graph run: one span for the whole stream, its context around each step.

LangGraph runs a graph as a generator (``Pregel.stream`` / ``astream``; ``invoke`` and ``ainvoke``
consume them). The hop starts at the stream's first step, its context is attached around each step
only, and it ends when the stream ends, fails or is closed (see :mod:`otel_guard._steps`, which runs
every generator hop of the package). The consumer never sees the hop's context.

``enter`` decides where the run stands (a new hop, a hop it joins, a hop that arrived from another
process) and returns the context to run the steps in, with the :class:`~otel_guard.guard.Delegation`
to finish at the end (``None`` when the run joined a hop that someone else finishes).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Any, TypeVar

from opentelemetry import context

from otel_guard._steps import Done, Enter, async_generator_in_context, generator_in_context
from otel_guard.guard import Delegation

Y = TypeVar("Y")

StepContext = tuple[context.Context, Delegation | None]
"""The context a stream's steps run in, and the hop to finish when the stream is done (if any)."""


def stream_in_hop(
    enter: Callable[[], StepContext], make: Callable[[], Iterator[Y]]
) -> Generator[Y, Any, Any]:
    """Iterate ``make()`` with the context ``enter()`` returns attached around every step.

    ``enter`` runs at the first step (a generator does nothing until it is iterated) and may raise
    :class:`~otel_guard.errors.DelegationRefused`; then ``make`` is never called.
    """
    return generator_in_context(_finishing(enter), make)()


def astream_in_hop(
    enter: Callable[[], StepContext], make: Callable[[], AsyncIterator[Y]]
) -> AsyncGenerator[Y, Any]:
    """The ``async`` form of :func:`stream_in_hop`."""
    return async_generator_in_context(_finishing(enter), make)()


def _finishing(enter: Callable[[], StepContext]) -> Enter:
    """``enter`` that ends the hop it opened when the stream is done, and nothing for a joined hop."""

    def enter_steps() -> tuple[context.Context, Done]:
        ctx, hop = enter()
        return ctx, (hop.finish if hop is not None else _joined)

    return enter_steps


def _joined(exc: BaseException | None) -> None:
    """A joined hop is finished by whoever opened it."""
