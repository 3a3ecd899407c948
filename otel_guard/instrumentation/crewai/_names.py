"""The names CrewAI hops go by: an agent by its role, a tool by the name the model calls it by, and a
delegation to a coworker by the coworker it reaches.

CrewAI agents have no name field; an agent is its ``role`` ("Budget Analyst"), which is also how a
delegating agent names the coworker it wants. A tool goes by the name CrewAI gives the model
(``sanitize_tool_name``: "Delegate work to coworker" is called ``delegate_work_to_coworker``), which is
the name the tool-call hooks report. A delegation tool ("Delegate work to coworker", "Ask question to
coworker": any ``BaseAgentTool``) runs another agent: its call is a hop into that agent, found among
the tool's coworkers the way the tool finds it (case and spacing ignored), so the delegated run is the
same hop and a delegation back to an agent on the path is a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from otel_guard.guard import HopKind

_AGENT_WITHOUT_ROLE = "agent"


def agent_name(agent: Any) -> str:
    """The hop name of a CrewAI agent: its role, with runs of whitespace (newlines too) made one space."""
    role = getattr(agent, "role", None)
    name = " ".join(role.split()) if isinstance(role, str) else ""
    return name or _AGENT_WITHOUT_ROLE


def _delegation_tool(tool: Any) -> Any | None:
    """The ``BaseAgentTool`` behind a tool the model called, or ``None`` for any other tool.

    The hook context holds the ``CrewStructuredTool`` the executor runs; the ``BaseTool`` it was made
    from is its ``_original_tool``.
    """
    from crewai.tools.agent_tools.base_agent_tools import BaseAgentTool

    for candidate in (tool, getattr(tool, "_original_tool", None)):
        if isinstance(candidate, BaseAgentTool):
            return candidate
    return None


def _requested_coworker(tool_input: Mapping[str, Any]) -> str | None:
    """The coworker a delegation call asks for, read as ``BaseAgentTool._get_coworker`` reads it."""
    coworker = tool_input.get("coworker") or tool_input.get("co_worker")
    if not isinstance(coworker, str):
        return None
    if coworker.startswith("[") and coworker.endswith("]"):
        coworker = coworker[1:-1].split(",")[0]
    return coworker


def _coworker(delegation: Any, tool_input: Mapping[str, Any]) -> Any | None:
    """The agent a delegation call reaches (the first coworker whose role matches), or ``None``."""
    requested = _requested_coworker(tool_input)
    if requested is None:
        return None
    wanted = delegation.sanitize_agent_name(requested)
    for agent in delegation.agents:
        if delegation.sanitize_agent_name(agent.role) == wanted:
            return agent
    return None


def tool_call_hop(tool_name: str, tool: Any, tool_input: Mapping[str, Any]) -> tuple[str, HopKind] | None:
    """(hop name, kind) of a tool call the model made, or ``None`` when there is no such tool.

    A delegation to a coworker it can find is a hop into that agent; any other call, a delegation
    to a coworker it cannot find included (the tool answers with CrewAI's error), is a tool hop.
    """
    if tool is None or not tool_name:
        return None  # an unknown tool: CrewAI reports it, nothing is delegated
    delegation = _delegation_tool(tool)
    if delegation is not None:
        coworker = _coworker(delegation, tool_input)
        if coworker is not None:
            return agent_name(coworker), "agent"
    return tool_name, "tool"


def reachable(tools: Iterable[Any]) -> dict[str, str]:
    """Hop name -> description of what each of ``tools`` calls: a tool under the name the model
    calls it by, a delegation tool as each coworker it can reach (described by the coworker's goal)."""
    from crewai.utilities.string_utils import sanitize_tool_name

    docs: dict[str, str] = {}
    for tool in tools:
        delegation = _delegation_tool(tool)
        if delegation is not None:
            for coworker in delegation.agents:
                docs.setdefault(agent_name(coworker), str(getattr(coworker, "goal", "") or ""))
            continue
        name = getattr(tool, "name", None)
        if isinstance(name, str) and name:
            docs.setdefault(sanitize_tool_name(name), str(getattr(tool, "description", "") or ""))
    return docs
