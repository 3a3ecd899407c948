"""Where a Strands run stands: what the guard keeps in the OpenTelemetry context, and its switch.

The guard's hooks and middleware are added to each ``Agent`` (and ``Swarm``) as it is built, and a
hook cannot be taken off an agent again. So :func:`guarding` is the switch every one of them reads
first: on while the instrumentor is instrumented and instrumentation is not suppressed.

What one hop hands to the next travels in the OpenTelemetry context, beside the chain itself, so it
follows the run wherever Strands carries the context (tool tasks, the threads sync tools and
``Agent.__call__`` run in):

* :data:`CALL`: the tool call whose body is running, as a :class:`Call`. An agent run of the same
  name inside it is that call (an agent offered as a tool) and joins its hop instead of standing in
  the chain twice. Every agent run clears it for what runs inside.
* :data:`RUN`: the agent run in force, as a :class:`Run`: its hop's span carries the run's budget
  events, and the run's end finds its own hop here.

A swarm invocation's handoffs (:class:`SwarmRun`) are kept in the invocation state Strands hands to
every node and tool of that invocation instead (see :mod:`._swarm`).
"""

from __future__ import annotations

from contextvars import Token
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.guard import Delegation

CALL: Final = otel_context.create_key("otel_guard.strands.call")
RUN: Final = otel_context.create_key("otel_guard.strands.run")


class _Switch:
    on = False


_switch = _Switch()


def switch_on(on: bool) -> None:
    """Turn every hook and middleware the guard added (and will add) on or off."""
    _switch.on = on


def guarding() -> bool:
    """Whether the guard acts now: instrumented, and instrumentation not suppressed."""
    return _switch.on and is_instrumentation_enabled()


@dataclass(frozen=True)
class Call:
    """A tool call whose hop is open: a run of ``name`` inside it is that call."""

    name: str
    hop: Delegation


@dataclass(eq=False)
class Run:
    """An agent run: ``hop`` is its own hop, the handoff it runs in, or the call's it joined.

    ``ends_hop`` says whether the run's end ends ``hop`` (not when it joined a tool call's hop, which
    ends with the call); ``token`` detaches the run's context.
    """

    hop: Delegation
    ends_hop: bool
    token: Token[Context] | None = None


@dataclass
class SwarmRun:
    """One swarm invocation: the handoff its running node made, open until ``target`` runs."""

    swarm: Any
    handoff: Delegation | None = None
    target: str | None = None
