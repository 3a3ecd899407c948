"""What a run's SDK MCP tool servers learn of it: the open tool calls and the run being served.

An SDK MCP server runs its tools in a task of its own, started with the run, not in the task of the
call; the CLI names each call's ``tool_use_id`` in the MCP request's ``_meta``
(``claudecode/toolUseId``) and nothing else of it. A call decided in the run's ``PreToolUse`` hook
(every call while a model budget is on) reaches the tool as its open hop in :data:`OPEN_CALLS`; ids
are unique across runs, so one table serves every run. Any other call is decided by the tool's
server itself, by the run in :data:`SERVING`.

What a reader would not guess: :data:`SERVING` is exact because the SDK starts a server's session
(``sdk_mcp_bridge._Session``, a detached task) from the handler of the run's first ``mcp_message``
request, a task of the run's read loop, whose context the guard gives the run at ``Query.start``:
one server object shared by several runs (nested loops share one) is served to each by its own task.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final, NamedTuple, Protocol

from opentelemetry.context import Context


class OpenCall(NamedTuple):
    """A tool call whose hop is open: its context, and what ends it (once; with the call's error)."""

    context: Context
    end: Callable[[BaseException | None], object]


class ServedRun(Protocol):
    """What a tool server asks of the run it serves (:class:`._runs.Run`, which imports this module)."""

    async def open_call(self, call_id: str, tool: str) -> OpenCall | str | None:
        """The hop of a call no hook decided: open (its context), refused (the refusal's text), or
        ``None``: the call is no hop (the run is over)."""
        ...


OPEN_CALLS: Final[dict[str, OpenCall]] = {}
"""tool_use_id -> the call's hop, while the call is open, for a call decided in ``PreToolUse``."""

SERVING: Final[ContextVar[ServedRun | None]] = ContextVar("otel_guard_claude_run", default=None)
"""The run whose CLI the current task serves (set in its read loop and the tasks it starts)."""

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
