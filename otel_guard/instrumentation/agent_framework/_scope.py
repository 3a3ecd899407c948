"""Where an Agent Framework run stands: what the guard keeps in the OpenTelemetry context, and its switch.

The guard's agent middleware is added to each agent as it is built, and stays there until
``uninstrument()`` takes it off again; :func:`guarding` is the switch every middleware of the guard
reads first: on while the instrumentor is instrumented and instrumentation is not suppressed.

What one hop hands to the next travels in the OpenTelemetry context, beside the chain itself, so it
follows the run wherever Agent Framework carries the context (the worker thread of a sync tool, a
stream consumed in another task):

* :data:`CALL`: the tool call whose body is running, as a :class:`Call`. An agent run of the same
  name inside it is that call (an agent offered as a tool) and joins its hop instead of standing in
  the chain twice. Every agent run clears it for what runs inside.
* :data:`RUN`: the agent run in force, as a :class:`Run`: its hop's span carries the run's budget
  events.
* :data:`TURN`: a handoff workflow executor's turn, where the handoffs its agent makes wait for
  their targets (:mod:`._handoffs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.guard import Delegation

CALL: Final = otel_context.create_key("otel_guard.agent_framework.call")
RUN: Final = otel_context.create_key("otel_guard.agent_framework.run")
TURN: Final = otel_context.create_key("otel_guard.agent_framework.turn")


class _Switch:
    on = False


_switch = _Switch()


def switch_on(on: bool) -> None:
    """Turn every middleware the guard added (and will add) on or off."""
    _switch.on = on


def guarding() -> bool:
    """Whether the guard acts now: instrumented, and instrumentation not suppressed."""
    return _switch.on and is_instrumentation_enabled()


def agent_name(agent: Any) -> str:
    """The name an agent's hops carry: its ``name``, else its ``id``, as in Agent Framework's own
    ``invoke_agent`` spans."""
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else str(getattr(agent, "id", "agent"))


@dataclass(frozen=True)
class Call:
    """A tool call whose hop is open: a run of the agent ``name`` inside it is that call."""

    name: str
    hop: Delegation


@dataclass(eq=False)
class Run:
    """An agent run: ``hop`` is its own hop, or the call's it joined (``ends_hop`` false)."""

    hop: Delegation
    ends_hop: bool
    ended: bool = False
    error: BaseException | None = None  # what ended a streamed run's pull, if one failed

    def end(self, exc: BaseException | None = None) -> None:
        """End the run: its own hop ends with it (once, however the run ends)."""
        if self.ended:
            return
        self.ended = True
        if self.ends_hop:
            self.hop.finish(exc if exc is not None else self.error)
