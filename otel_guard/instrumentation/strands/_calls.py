"""What a Strands tool call is as a hop, and what its refusal gives the model.

Which hop a call is (:func:`hop_of`):

* an agent offered as a tool (``agent.as_tool()``, or an ``Agent`` in another agent's ``tools``) is a
  hop into that agent, ``invoke_agent {agent.name}``, and the agent's run inside it joins that hop;
* a swarm's ``handoff_to_agent`` call is a transfer into the target node's agent (its caller waits
  for nothing), kept open until the target has run (see :mod:`._swarm`);
* any other tool is ``execute_tool {tool name}``; an agent run of the same name inside it joins it.

What a refusal looks like (:func:`refused_result`): the refused call's body never runs; the call
gives what a failing tool gives Strands, a ``ToolResultEvent`` with ``status: "error"`` and
:func:`refusal_text`, with the ``DelegationRefused`` as its exception (``AfterToolCallEvent`` hooks
receive it), so the model reads it and the run goes on. A ``DelegationRefused`` raised inside the
tool (a sub-agent whose run was refused) fails the tool with the same text
(:func:`with_refusal_text`) in place of Strands' ``"Error: DelegationRefused - ..."``.
"""

from __future__ import annotations

from typing import Any, Literal

from strands.types.events import ToolResultEvent
from strands.types.tools import ToolResult

from otel_guard.errors import DelegationRefused
from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.strands._scope import SwarmRun
from otel_guard.instrumentation.strands._swarm import handoff_target


def hop_of(
    tool: Any, tool_use: Any, invocation_state: Any, agent: Any
) -> tuple[str, Literal["agent", "tool"], SwarmRun | None] | None:
    """(hop name, kind, the swarm run of a handoff) for a call of ``tool``; ``None``: no hop."""
    handoff = handoff_target(tool_use, invocation_state, agent)
    if handoff is not None:
        target, swarm_run = handoff
        return target, "agent", swarm_run
    inner = getattr(tool, "agent", None) if tool.tool_type == "agent" else None
    agent_name = getattr(inner, "name", None)
    if isinstance(agent_name, str) and agent_name:
        return agent_name, "agent", None
    name = getattr(tool, "tool_name", None) or tool_use.get("name")
    return (name, "tool", None) if isinstance(name, str) and name else None


def refused_result(tool_use_id: object, err: DelegationRefused) -> ToolResultEvent:
    """A refused call as Strands reports a failed tool to the model: an error ``ToolResult``."""
    text = refusal_text(err)
    result: ToolResult = {"toolUseId": str(tool_use_id), "status": "error", "content": [{"text": text}]}
    return ToolResultEvent(result, exception=err)


def with_refusal_text(result: ToolResultEvent) -> ToolResultEvent:
    """The call's result, with the refusal's text when a refusal inside the tool failed it."""
    err = refusal_behind(result.exception)
    return result if err is None else refused_result(result.tool_use_id, err)
