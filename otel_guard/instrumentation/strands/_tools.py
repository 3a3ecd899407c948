"""Tool calls as hops: a ``BeforeToolCallEvent`` hook on every ``Agent`` gives each call a proxy.

Strands fires ``BeforeToolCallEvent`` for every tool call (a model's, a direct ``agent.tool.x()``
call) and lets its hooks choose the tool the call runs (``event.selected_tool``). Then the
``ExecuteToolStage`` middleware chain runs, and its terminal opens Strands' own ``execute_tool
{name}`` span and streams the selected tool. The guard's hook, among the last of the agent's hooks
(``SDK_LAST``), selects :class:`~._tool_stream.ToolInHop` in the tool's place: a transparent proxy
(every attribute and ``isinstance`` answer for the tool) whose stream is the hop. So the hop is
decided inside Strands' span of the call and before the tool's body, whatever the middleware does
around it, and a call a hook cancelled or interrupted is no hop (nothing was delegated).

Which hop a call is and what its refusal looks like: :mod:`._calls`. Strands'
structured-output tool is not a hop: nothing is delegated.
"""

from __future__ import annotations

from typing import Any, Final

from otel_guard.instrumentation.strands._scope import guarding
from otel_guard.instrumentation.strands._tool_stream import ToolInHop

_STRUCTURED_OUTPUT: Final = "structured_output"
"""The ``tool_type`` of the tool Strands adds for structured output (not a delegation)."""


def install(agent: Any) -> None:
    """Add the tool-call hook to a newly built ``Agent``."""
    from strands.hooks import BeforeToolCallEvent, HookOrder

    # Last of the agent's hooks: the others may still cancel the call or choose another tool.
    agent.add_hook(tool_call_starting, BeforeToolCallEvent, order=HookOrder.SDK_LAST)


def tool_call_starting(event: Any) -> None:
    """``BeforeToolCallEvent``: the call will run the selected tool inside its hop."""
    if event.cancel_tool or not guarding():
        return
    tool = event.selected_tool
    if tool is None or tool.tool_type == _STRUCTURED_OUTPUT:
        return  # an unknown tool fails before anything runs; structured output delegates nothing
    if tool.tool_name != event.tool_use.get("name"):
        # Renamed by an earlier hook without choosing a tool: Strands looks the new name up itself
        # (by the identity of the tool it selected first), and that lookup must stay its own.
        return
    event.selected_tool = ToolInHop(tool, event.agent)
