"""What an ADK invocation keeps between the guard plugin's callbacks: open tool hops, handed-over hops.

ADK tells a plugin about a call in separate callbacks (before a tool runs, after it, on its error), so
a hop that starts in one callback and ends in another waits here:

* A tool call's hop starts in ``before_tool_callback`` and ends in ``after_tool_callback`` or
  ``on_tool_error_callback``. ADK hands all three the same ``ToolContext``, which keys the call (weakly:
  a context ADK drops takes its entry with it).
* A call that hands control to an agent ADK runs elsewhere (a transfer, a single-turn or task
  sub-agent) is decided when the model asks for it, in the calling agent's context, but the agent runs
  outside that context: in ADK 2's node runtime a transfer's target starts once the transferring
  agent's run has ended, and a sub-agent runs in the context ADK captured before the call. The decided
  hop (or, for a task agent, its refusal) is handed over here under (invocation id, agent) until the
  agent's run takes it over.

The context a hop runs in also names the hop's span (:func:`in_hop`): ADK's own span of the call is
the current span inside it, and what the guard records during the hop (a model request it refuses)
belongs on the hop's span (:func:`hop_span`).

Whatever an invocation leaves here (a tool whose own callback raised before ADK reported its end, a
transfer whose target never ran) is ended when the runner reports the invocation over
(``after_run_callback`` / ``on_run_error_callback``), so no allowed hop goes unrecorded.
"""

from __future__ import annotations

import weakref
from contextvars import Token
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation

_HOP_SPAN = otel_context.create_key("otel_guard.google_adk.hop_span")


def in_hop(hop_context: otel_context.Context, hop: Delegation) -> otel_context.Context:
    """``hop_context`` (the context ``hop`` gave), naming ``hop``'s span for what runs inside it."""
    return otel_context.set_value(_HOP_SPAN, hop.span, hop_context)


def hop_span() -> trace.Span | None:
    """The span of the hop whose context is in force, if a hop of this instrumentation made it."""
    span = otel_context.get_value(_HOP_SPAN)
    return span if isinstance(span, trace.Span) else None


@dataclass
class ToolCall:
    """A tool call's open hop, and the attach token of the context its tool runs in."""

    hop: Delegation
    token: Token[otel_context.Context]
    invocation_id: str

    def close(self, exc: BaseException | None) -> None:
        """End the hop from the callback that reports the call's end (the context it attached)."""
        otel_context.detach(self.token)
        self.hop.finish(exc)


class Calls:
    """The open tool hops and the handed-over hops of every invocation in this process."""

    def __init__(self) -> None:
        self._tools: weakref.WeakKeyDictionary[object, ToolCall] = weakref.WeakKeyDictionary()
        self._handed_over: dict[tuple[str, str], list[Delegation | DelegationRefused]] = {}

    def opened(self, tool_context: object, call: ToolCall) -> None:
        self._tools[tool_context] = call

    def closing(self, tool_context: object) -> ToolCall | None:
        """The open call of ``tool_context``, now no longer open (``None`` when it had none)."""
        return self._tools.pop(tool_context, None)

    def hand_over(self, invocation_id: str, agent: str, hop: Delegation | DelegationRefused) -> None:
        """Keep ``hop`` (decided, not opened; or refused) for the next run of ``agent`` in this invocation."""
        self._handed_over.setdefault((invocation_id, agent), []).append(hop)

    def waiting(self, invocation_id: str, agent: str) -> bool:
        """Whether a hop (or refusal) handed over to ``agent`` in this invocation waits for its run."""
        return (invocation_id, agent) in self._handed_over

    def take_over(self, invocation_id: str, agent: str) -> Delegation | DelegationRefused | None:
        """The oldest hop (or refusal) handed over to ``agent`` in this invocation, if any."""
        waiting = self._handed_over.get((invocation_id, agent))
        if not waiting:
            return None
        hop = waiting.pop(0)
        if not waiting:
            del self._handed_over[(invocation_id, agent)]
        return hop

    def end_invocation(self, invocation_id: str, exc: BaseException | None) -> None:
        """End every hop ``invocation_id`` left open; the contexts they attached are gone already."""
        if not self._handed_over and not self._tools:
            return  # the usual end of an invocation: nothing left open
        for key in [key for key in self._handed_over if key[0] == invocation_id]:
            for hop in self._handed_over.pop(key):
                if isinstance(hop, Delegation):
                    hop.finish(exc)
        for tool_context, call in list(self._tools.items()):
            if call.invocation_id == invocation_id:
                del self._tools[tool_context]
                call.hop.finish(exc)


calls = Calls()
"""The process's one record: a hop opened under one runner may end under another (an ``AgentTool``
runs its agent in a runner of its own that shares the caller's plugins)."""
