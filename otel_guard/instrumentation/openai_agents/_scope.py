"""What one OpenAI Agents SDK run carries between its turns: the hops its handoffs opened.

A run starts as one hop (``invoke_agent {starting agent}``). A handoff moves the conversation to
another agent *inside the same run*, so the hop into that agent cannot be a ``with`` block around a
call: it opens when the handoff is taken and stays open until the run ends. Its context (the span and
the chain that now ends with the new agent) must be in force for every later turn, and those turns
may run in tasks the SDK creates (the first turn runs beside the input guardrails), where a context
attached inside the handoff would not reach. So the run keeps a :class:`RunScope` in a context
variable, a turn attaches :attr:`RunScope.context` around itself, and the run closes the handoff hops,
newest first, when it ends.

Nested runs (an agent used as a tool) set their own scope in their own task; the outer scope is never
touched by them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field

from opentelemetry import context as otel_context

from otel_guard.guard import Delegation


@dataclass
class RunScope:
    """The hops one run opened for its handoffs, and the context its next turn runs in."""

    context_of_run: otel_context.Context
    """The context the run was started in: its own hop's, or the enclosing one when it joined one."""

    server_managed: bool = False
    """Whether the server holds the conversation (``conversation_id`` / ``previous_response_id``)."""

    handoffs: list[Delegation] = field(default_factory=list)
    """Handoff hops still open, oldest first."""

    @property
    def context(self) -> otel_context.Context | None:
        """The context of the newest handoff hop, or ``None`` while no handoff was taken."""
        return self.handoffs[-1].context if self.handoffs else None

    def close(self, exc: BaseException | None) -> None:
        """End every handoff hop, newest first (each is the parent of the next one)."""
        while self.handoffs:
            self.handoffs.pop().finish(exc)


current_run: ContextVar[RunScope | None] = ContextVar("otel_guard_openai_agents_run", default=None)
"""The scope of the run whose code is executing, ``None`` outside a guarded run."""
