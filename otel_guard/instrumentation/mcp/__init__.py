"""Guard MCP tool calls, client and server: every ``tools/call`` is a hop, checked again by the server.

Switch it on with ``opentelemetry-instrument`` (extra ``mcp``), or in code:
``MCPInstrumentor().instrument()``.
``ClientSession.call_tool`` is a CLIENT hop ``execute_tool {name}``, its chain in the request's
``_meta`` in every transport; the server checks it before the tool body runs (in one process,
``Client(server)`` hands its hop over: :mod:`._in_process`). A refusal is a ``CallToolResult`` with
``isError`` and text the model can act on. What is a hop and what is left out: docs/runtimes/mcp.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import Any, Final

from wrapt import wrap_function_wrapper

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.mcp.package import _instruments

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    ("mcp.client.session", "ClientSession.call_tool"),
    ("mcp.server.lowlevel.server", "Server.get_request_handler"),
    ("mcp.server.mcpserver.server", "MCPServer.call_tool"),
)
"""Every (module, attribute) this instrumentor wraps; ``_uninstrument`` unwraps them all."""

EXTRACTION: Final[PatchTarget] = ("mcp.server._otel", "extract_trace_context")
"""What MCP's server span reads ``_meta`` with: replaced by a plain function that keeps what it read
(not a ``wrapt`` proxy: see ``_carrier.remembering_extraction``), put back by ``_uninstrument``."""


class MCPInstrumentor(GuardInstrumentor):
    """Makes MCP ``call_tool`` (client) and ``tools/call`` handling (server) guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Imported here: the helpers import mcp, and this module must import without it.
        from otel_guard.instrumentation.mcp._carrier import remembering_extraction
        from otel_guard.instrumentation.mcp._client import guard_call_tool
        from otel_guard.instrumentation.mcp._server import guard_request_handler, keep_refusal_text

        client, server, mcpserver = PATCH_TARGETS
        wrap_function_wrapper(*client, guard_call_tool)
        wrap_function_wrapper(*server, guard_request_handler)
        wrap_function_wrapper(*mcpserver, keep_refusal_text)
        module = importlib.import_module(EXTRACTION[0])
        setattr(module, EXTRACTION[1], remembering_extraction(getattr(module, EXTRACTION[1])))

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.mcp._carrier import forgetting_extraction

        unwrap_all(PATCH_TARGETS)
        module = importlib.import_module(EXTRACTION[0])
        setattr(module, EXTRACTION[1], forgetting_extraction(getattr(module, EXTRACTION[1])))
