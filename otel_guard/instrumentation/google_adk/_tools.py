"""Which ADK tool call is which hop, and how a refused call answers the model.

Imported only where ADK is installed (the instrumentor imports it when it patches ADK).

* A function tool (any ``BaseTool``: ``FunctionTool``, an MCP tool, ...) is a hop ``execute_tool
  {tool.name}`` around its body (:class:`ToolHop`).
* An ``AgentTool`` (an agent called as a tool) is one hop ``invoke_agent {agent.name}`` around its
  body: the tool runs the agent in a runner of its own, in the tool's context, and that run joins the
  hop, so one call is one hop whatever the tool is named.
* A call that hands control to an agent ADK runs elsewhere (:class:`HandOver`) is a hop into that
  agent, decided before the call runs, in the calling agent's context, and opened when the agent's run
  starts: ``transfer_to_agent`` (the target runs after the transferring agent's run), a *transfer*
  (the transferring agent waits for nothing, so a transfer back to it is no cycle), and the tool ADK
  makes of a ``mode="single_turn"`` sub-agent (ADK runs it as a node, in the context it captured when
  it prepared the call, not the tool's), a call (the caller waits for its answer).
  ``transfer_to_agent`` itself is no hop, the transfer is: a tool hop too would take a second place
  of the chain for every transfer.
* A ``mode="task"`` sub-agent's call never reaches the tool callbacks (ADK 2's node runtime dispatches
  the task agent itself): the guard plugin decides it from the model's response (:func:`task_calls`).
* Not hops, because nothing is delegated: a call of a tool the agent does not have (ADK answers it
  itself), the structured-output tool ``set_model_response`` and a task agent's ``finish_task``. A call
  into a remote agent whose A2A send is guarded is left to that send (see :mod:`._remote`).

A refused call answers the model the way ADK reports a tool that could not run (a tool the model made
up, arguments it got wrong): a function response ``{"error": "..."}`` holding the refusal text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from google.adk.agents.llm.task._finish_task_tool import FinishTaskTool
from google.adk.tools.agent_tool import AgentTool, _SingleTurnAgentTool, _TaskAgentTool
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.tools.set_model_response_tool import SetModelResponseTool
from google.adk.tools.transfer_to_agent_tool import transfer_to_agent

from otel_guard.errors import DelegationRefused
from otel_guard.guard import HopKind
from otel_guard.instrumentation._base import PatchTarget, refusal_text
from otel_guard.instrumentation.google_adk._remote import hopped_by_a2a

INTERNAL_NAMES: Final[tuple[PatchTarget, ...]] = (
    ("google.adk.tools.agent_tool", "_SingleTurnAgentTool"),
    ("google.adk.tools.agent_tool", "_TaskAgentTool"),
    ("google.adk.agents.llm.task._finish_task_tool", "FinishTaskTool"),
)
"""ADK names (not patched) that this module tells tools apart by; a test resolves each one."""


@dataclass(frozen=True)
class ToolHop:
    """The call is a hop into ``name`` (a tool, or an agent called as a tool) around its body."""

    name: str
    kind: HopKind


@dataclass(frozen=True)
class HandOver:
    """The call hands control to ``agent``: a hop decided now and opened by that agent's run. A
    ``transfer`` passes control for good (the calling agent waits for nothing); otherwise the agent
    answers the caller, which waits (a call)."""

    agent: str
    transfer: bool


def hop_of(tool: Any, tool_args: dict[str, Any]) -> ToolHop | HandOver | None:
    """The hop a call of ``tool`` with ``tool_args`` makes, or ``None`` for none."""
    if is_transfer(tool):
        target = tool_args.get("agent_name")
        return HandOver(target, transfer=True) if isinstance(target, str) and target else None
    # ADK answers a call of a tool it does not know with a bare BaseTool placeholder.
    if type(tool) is BaseTool or isinstance(tool, (SetModelResponseTool, FinishTaskTool, _TaskAgentTool)):
        return None
    if isinstance(tool, AgentTool):
        agent = tool.agent
        if hopped_by_a2a(agent):
            return None
        return (
            HandOver(agent.name, transfer=False)
            if isinstance(tool, _SingleTurnAgentTool)
            else ToolHop(agent.name, "agent")
        )
    name = getattr(tool, "name", None)
    return ToolHop(name, "tool") if isinstance(name, str) and name else None


def task_agents(agent: Any) -> dict[str, Any]:
    """Tool name -> task agent, for ``agent``'s task sub-agents (``mode="task"``); most have none."""
    tools = getattr(agent, "tools", None) or ()
    return {tool.name: tool.agent for tool in tools if isinstance(tool, _TaskAgentTool)}


def task_calls(tasks: dict[str, Any], response_parts: list[Any]) -> list[Any]:
    """The task agents (of ``tasks``, from :func:`task_agents`) that ``response_parts``, a model
    response, delegate to, in order."""
    called = [part.function_call.name for part in response_parts if part.function_call is not None]
    return [tasks[name] for name in called if name in tasks and not hopped_by_a2a(tasks[name])]


def is_transfer(tool: Any) -> bool:
    """Whether ``tool`` is ADK's ``transfer_to_agent`` (the ``TransferToAgentTool`` or the bare function)."""
    return isinstance(tool, FunctionTool) and tool.func is transfer_to_agent


def transfer_targets(tool: Any) -> tuple[str, ...]:
    """The agents a ``TransferToAgentTool`` offers (its declaration's enum), ``()`` for another tool."""
    names = getattr(tool, "_agent_names", None) if is_transfer(tool) else None
    return tuple(name for name in names or () if isinstance(name, str))


def refusal_response(err: DelegationRefused) -> dict[str, str]:
    """The function response of a refused call: ADK's ``{"error": ...}`` form."""
    return {"error": refusal_text(err)}
