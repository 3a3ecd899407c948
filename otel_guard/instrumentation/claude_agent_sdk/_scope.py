"""The tool calls in progress of every run in this process, by the CLI's ``tool_use_id``.

An SDK MCP server runs its tools in a task of its own, started with the run, not in the task of the
call: the call's hop context reaches the tool through this table. The CLI names each call's
``tool_use_id`` in the ``PreToolUse`` hook (where the hop is decided) and again in the MCP request's
``_meta`` (``claudecode/toolUseId``), where the tool is called; ids are unique across runs, so one
table serves every run (a tool server may serve several runs at once: nested loops share one).

The tool server that runs the call also ends its hop when the tool returns (:data:`ENDING_SERVERS`):
the CLI is not asked to tell the guard (a ``PostToolUse`` round trip) about a call the guard saw end.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from opentelemetry.context import Context


class OpenCall(NamedTuple):
    """A tool call whose hop is open: its context, and what ends it (once; with the call's error)."""

    context: Context
    end: Callable[[BaseException | None], object]


OPEN_CALLS: Final[dict[str, OpenCall]] = {}
"""tool_use_id -> the call's hop, while the call is open."""

ENDING_SERVERS: Final[weakref.WeakSet[Any]] = weakref.WeakSet()
"""The SDK MCP servers whose tool calls run in their hop and end it (built while instrumented)."""

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
