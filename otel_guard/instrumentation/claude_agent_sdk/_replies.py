"""The run's model replies as its read loop reads them: which agent made each tool call.

The CLI makes the model requests and runs the tools; what the SDK reads of a reply is one assistant
message per content block, all with the reply's ``message.id``, a sub-agent's with the
``parent_tool_use_id`` of the Agent call that started it (none: the main thread's). An SDK MCP call
reaches its tool server named by its ``tool_use_id`` alone, so :class:`ReadingTransport` sits where the
run's read loop reads the CLI and tells the run, of each ``tool_use`` block, who made it; with a model
budget on, each new reply is counted first (:mod:`._usage`), so a reply that spent the tree denies
the calls it made. What a reader would not guess: the CLI writes a reply and the requests of its
calls (a hook's, the MCP ``tools/call``) within milliseconds, in either order; a call waits for its
reply to be read (:meth:`._runs.Run.reply_of`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import wrapt

from otel_guard.instrumentation.claude_agent_sdk._usage import CountedRun, count_reply, count_result

if TYPE_CHECKING:
    _TransportProxy = wrapt.ObjectProxy[Any]
else:  # wrapt < 2 has no subscriptable proxy type
    _TransportProxy = wrapt.ObjectProxy


class ReadRun(CountedRun, Protocol):
    """What the reading needs of a run (:class:`._runs.Run`, which imports this module)."""

    counting: bool

    def reply_read(self, calls: list[str], parent_tool_use_id: Any) -> None: ...


class ReadingTransport(_TransportProxy):
    """The run's transport, whose assistant messages tell the run who made each tool call."""

    def __init__(self, transport: Any, run: ReadRun) -> None:
        super().__init__(transport)
        self._self_run = run

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        run = self._self_run
        async for message in self.__wrapped__.read_messages():
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "assistant":
                reply = message.get("message")
                content = reply.get("content") if isinstance(reply, dict) else None
                if run.counting:
                    await count_reply(run, message)
                calls = [
                    str(block["id"])
                    for block in content or ()
                    if isinstance(block, dict) and block.get("type") == "tool_use" and "id" in block
                ]
                if calls:
                    run.reply_read(calls, message.get("parent_tool_use_id"))
            elif kind == "result" and run.counting:
                await count_result(run, message)
            yield message
