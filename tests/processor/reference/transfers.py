"""Chains of handoffs and calls as the spans that record them, for the transfer tests.

A chain is a list of hops ``(agent, transfer)``, the first hop the chain's start; each hop runs
inside the one before it (one trace, nested as the inline guard nests its hops), written in one of
:data:`STYLES`:

- ``guard``: the inline guard's hop spans (``otel_guard.hop.kind`` ``call`` or ``transfer``, and on
  a transfer the GenAI conventions' ``gen_ai.transfer.mode`` ``pass_control``), as
  ``otel_guard.delegate(..., transfer=...)`` writes them;
- ``guard_runtime``: the same, each with a runtime's own ``invoke_agent`` span of the call inside it;
- ``conventions``: no guard; every hop after the first is the conventions' tool-based transfer
  (``execute_tool transfer_to_X X``, ``gen_ai.transfer.mode`` ``pass_control`` for a handoff and
  ``return_to_caller`` for an agent called as a tool) with the target's ``invoke_agent X`` below it.

What a reader would not guess: only the hop's own span (or its tool's) says it is a transfer; the
agent it leaves is the one that stops waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from processor_spans import AttributeValue, Trace, guard_attributes

Hop = tuple[str, bool]  # (agent, transfer)

STYLES: Final = ("guard", "guard_runtime", "conventions")
GUARD_SCOPE: Final = "otel_guard"
RUNTIME_SCOPE: Final = "openai_agents"


def spans(hops: Sequence[Hop], style: str, trace: Trace | None = None) -> list[tuple[str, Span]]:
    """The spans of one chain of ``hops`` in ``style``, as (scope, span), in the order they start."""
    trace = trace or Trace()
    out: list[tuple[str, Span]] = []
    parent: Span | None = None
    for at, (agent, transfer) in enumerate(hops):
        genai: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
        }
        if style == "conventions":
            if at > 0:
                source = hops[at - 1][0]
                tool = {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": f"transfer_to_{agent}",
                    "gen_ai.agent.name": source,
                    "gen_ai.transfer.mode": "pass_control" if transfer else "return_to_caller",
                    "gen_ai.transfer.target.name": agent,
                    "gen_ai.transfer.target.type": "agent",
                }
                parent = trace.span(f"execute_tool transfer_to_{agent} {agent}", parent, attributes=tool)
                out.append((RUNTIME_SCOPE, parent))
            parent = trace.span(f"invoke_agent {agent}", parent, attributes=genai)
            out.append((RUNTIME_SCOPE, parent))
            continue
        chain = [name for name, _ in hops[: at + 1]]
        attributes = {
            **genai,
            **guard_attributes(chain),
            "otel_guard.hop.kind": "transfer" if transfer else "call",
        }
        if transfer:
            attributes["gen_ai.transfer.mode"] = "pass_control"
        parent = trace.span(f"invoke_agent {agent}", parent, attributes=attributes)
        out.append((GUARD_SCOPE, parent))
        if style == "guard_runtime":
            parent = trace.span(f"invoke_agent {agent}", parent, attributes=genai)
            out.append((RUNTIME_SCOPE, parent))
    return out
