"""The tool calls in progress of every run in this process, by the CLI's ``tool_use_id``.

An SDK MCP server runs its tools in a task of its own, started with the run, not in the task of the
call: the call's hop context reaches the tool through this table. The CLI names each call's
``tool_use_id`` in the ``PreToolUse`` hook (where the hop is decided) and again in the MCP request's
``_meta`` (``claudecode/toolUseId``), where the tool is called; ids are unique across runs, so one
table serves every run (a tool server may serve several runs at once: nested loops share one).
"""

from __future__ import annotations

from typing import Any, Final

from opentelemetry.context import Context

OPEN_CALLS: Final[dict[str, Context]] = {}
"""tool_use_id -> the context of its hop, while the call is open."""

TOOL_USE_ID: Final = "claudecode/toolUseId"


def tool_use_id_of(params: Any) -> str | None:
    """The ``claudecode/toolUseId`` of an MCP ``tools/call`` request's parameters, if it has one."""
    meta = getattr(params, "meta", None)
    if meta is None and isinstance(params, dict):
        meta = params.get("_meta")
    if meta is None:
        return None
    if isinstance(meta, dict):
        value = meta.get(TOOL_USE_ID)
    else:
        value = getattr(meta, "model_extra", None) or {}
        value = value.get(TOOL_USE_ID) if isinstance(value, dict) else None
    return value if isinstance(value, str) else None
