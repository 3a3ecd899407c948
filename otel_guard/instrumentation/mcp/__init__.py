"""Guard MCP tool calls, client and server: every ``tools/call`` is a hop, checked again by the server.

Switch it on with ``opentelemetry-instrument`` (extra ``mcp``), or in code:
``MCPInstrumentor().instrument()``.
``ClientSession.call_tool`` is a CLIENT hop ``execute_tool {name}``, its chain in the request's
``_meta`` in every transport; the server checks it before the tool body runs (in one process,
``Client(server)`` hands its hop over: :mod:`._in_process`). A refusal is a ``CallToolResult`` with
``isError`` and text the model can act on. What is a hop and what is left out: docs/runtimes/mcp.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget
from otel_guard.instrumentation.mcp.package import _instruments

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    ("mcp.client.session", "ClientSession.call_tool"),
    ("mcp.server.lowlevel.server", "Server.get_request_handler"),
    ("mcp.server.mcpserver.server", "MCPServer.call_tool"),
)
"""Every (module, attribute) this instrumentor replaces; ``_uninstrument`` puts them all back. Plain
functions in their places, not ``wrapt`` proxies: MCP looks each up on every call (``_replacements``)."""

EXTRACTION: Final[PatchTarget] = ("mcp.server._otel", "extract_trace_context")
"""What MCP's server span reads ``_meta`` with: replaced by a function that keeps what it read."""


class MCPInstrumentor(GuardInstrumentor):
    """Makes MCP ``call_tool`` (client) and ``tools/call`` handling (server) guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Imported here: the helpers import mcp, and this module must import without it.
        from otel_guard.instrumentation._replacements import replace
        from otel_guard.instrumentation.mcp._carrier import remembering_extraction
        from otel_guard.instrumentation.mcp._client import guarding_call_tool
        from otel_guard.instrumentation.mcp._server import guarding_request_handler, keeping_refusal_text

        client, server, mcpserver = PATCH_TARGETS
        replace(client, guarding_call_tool)
        replace(server, guarding_request_handler)
        replace(mcpserver, keeping_refusal_text)
        replace(EXTRACTION, remembering_extraction)

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation._replacements import restore

        for target in (*PATCH_TARGETS, EXTRACTION):
            restore(target)
