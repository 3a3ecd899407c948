"""Guard MCP tool calls, client and server, with no code change.

Install the extra and run the program under ``opentelemetry-instrument``::

    pip install 'otel-guard[mcp]'
    OTEL_GUARD_CYCLE_RULE=agent opentelemetry-instrument python app.py

or instrument in code::

    from otel_guard.instrumentation.mcp import MCPInstrumentor

    MCPInstrumentor().instrument()

What becomes a hop:

- **Client**: every ``ClientSession.call_tool(name, ...)`` (so ``mcp.Client.call_tool`` and every
  framework adapter built on a ``ClientSession``) is a hop ``execute_tool {name}``, a CLIENT span.
  It is checked before the request is sent; the request's ``_meta`` then carries ``traceparent`` and
  ``baggage`` (with the chain), in every transport, the in-process ones included.
- **Server**: every ``tools/call`` served by a low-level ``mcp.server.lowlevel.Server`` or an
  ``mcp.server.mcpserver.MCPServer`` reads the chain from ``_meta`` and is checked again as a hop
  ``execute_tool {name}`` (a SERVER span, nested in MCP's own ``tools/call {name}`` span) before the
  tool body runs. A chain that already ends with this tool (the client added the hop) is checked
  again, not extended.

A refused call becomes a ``CallToolResult`` with ``isError: true`` whose text says why, names the
path, and says not to retry; the tool body never runs and the caller's run goes on. A refusal raised
inside a tool body (a deeper hop the body did not handle) reaches the caller with the same text.

Settings are the ``OTEL_GUARD_*`` environment variables or :func:`otel_guard.configure`. Tested with
``mcp`` 2.3 (the 2.x server API: ``MCPServer`` and the low-level ``Server``; mcp 1.x is not supported).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from wrapt import wrap_function_wrapper

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all

_INSTRUMENTS: Final = ("mcp >= 2.3, < 3",)

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    ("mcp.client.session", "ClientSession.call_tool"),
    ("mcp.server.lowlevel.server", "Server.get_request_handler"),
    ("mcp.server.mcpserver.server", "MCPServer.call_tool"),
)
"""Every (module, attribute) this instrumentor wraps; ``_uninstrument`` unwraps them all."""


class MCPInstrumentor(GuardInstrumentor):
    """Makes MCP ``call_tool`` (client) and ``tools/call`` handling (server) guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _INSTRUMENTS

    def _instrument(self, **kwargs: Any) -> None:
        # Imported here: the helpers import mcp, and this module must import without it.
        from otel_guard.instrumentation._mcp_client import guard_call_tool
        from otel_guard.instrumentation._mcp_server import guard_request_handler, keep_refusal_text

        client, server, mcpserver = PATCH_TARGETS
        wrap_function_wrapper(*client, guard_call_tool)
        wrap_function_wrapper(*server, guard_request_handler)
        wrap_function_wrapper(*mcpserver, keep_refusal_text)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)
