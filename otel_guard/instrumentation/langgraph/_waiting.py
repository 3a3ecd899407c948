"""Hops decided before their LangChain run began, whose spans open when the run starts.

A tool's or graph's hop is decided before its call (a refused call never begins) and its span opens
in the run-start callback of the call's own run, under the tracer's span of that run (see
``_wrappers``). Those callbacks run for every node and runnable of every graph, and nearly always no
hop waits: :data:`WAITING` lets them know that with one set test, without reading the context.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from otel_guard.guard import Delegation


class Pending(NamedTuple):
    """A hop decided before its call's LangChain run began, whose span opens when the run starts."""

    event: str  # the callback that begins the call's run: "tool" or "chain"
    hop: Delegation


WAITING: Final[set[Delegation]] = set()
"""The hops of every :class:`Pending` whose span has not opened yet, in any thread or task.

A hop leaves it when its span opens or when it finishes (its call may end before its run began), so
it holds only calls in progress; adding and discarding are atomic, so threads need no lock.
"""


def wait(event: str, hop: Delegation) -> Pending:
    """``hop``, decided, waits for the run of ``event`` to begin."""
    WAITING.add(hop)
    return Pending(event, hop)


def finish(hop: Delegation, exc: BaseException | None = None) -> None:
    """End ``hop`` (decided and maybe never opened: :meth:`Delegation.finish` opens it then)."""
    WAITING.discard(hop)
    hop.finish(exc)
