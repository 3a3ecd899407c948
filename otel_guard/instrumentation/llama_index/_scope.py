"""Where a LlamaIndex run stands: what the guard keeps in the OpenTelemetry context.

A workflow run is a task of its own, and each step of it another task; asyncio copies the context
into each when it is created. So what the guard attaches around ``run()`` (the hop's chain and span,
and :data:`RUN`) is the context of every step of that run and of every tool body it calls:

* :data:`RUN`: the agent or agent workflow run in force, as a :class:`Run` (the same object in every
  step of the run, so a step can leave something for the next: the agent a handoff put in charge);
* :data:`CALL`: the tool call whose body is running, as a :class:`Call`. An agent run of the same
  name inside it is that call (a tool named like the agent it runs) and joins its hop instead of
  standing in the chain twice; an agent run of another name directly in its body (an agent called
  as a tool) takes the tool's place in the chain. Every run clears it for what runs inside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otel_guard.guard import Delegation

CALL: Final = otel_context.create_key("otel_guard.llama_index.call")
RUN: Final = otel_context.create_key("otel_guard.llama_index.run")


@dataclass(frozen=True)
class Call:
    """A tool call whose hop is open: a run of ``name`` inside it is that call. ``caller_chain`` is
    the chain the call was made in (its baggage value), where an agent the tool runs takes its place."""

    name: str
    hop: Delegation
    caller_chain: object = None


@dataclass(eq=False)
class Run:
    """One run of an agent or an ``AgentWorkflow``.

    ``hop`` is the run's own hop (``None``: it joined the hop of the tool call it runs in, which ends
    with the call). ``handoffs`` are the handoffs taken in the run, oldest first: the newest one's
    ``in_charge`` context is where the agent now in charge makes its calls. Everything the run
    opened ends with it (:meth:`end`), when LlamaIndex's span of the run ends.
    """

    workflow: Any
    hop: Delegation | None
    span_id: str | None = None
    handoffs: list[Delegation] = field(default_factory=list)
    in_charge: Context | None = None
    ended: bool = False

    def hand_off(self, hop: Delegation) -> None:
        """A handoff was taken: its agent is in charge from now on, in the handoff's hop."""
        self.handoffs.append(hop)
        self.in_charge = hop.context

    def end(self, exc: BaseException | None) -> None:
        """End the run's handoffs (newest first), then its own hop; once."""
        if self.ended:
            return
        self.ended = True
        for hop in reversed(self.handoffs):
            hop.finish(exc)
        if self.hop is not None:
            self.hop.finish(exc)
