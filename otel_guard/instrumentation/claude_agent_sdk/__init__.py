"""Guard the Claude Agent SDK: the ``query()`` / ``ClaudeSDKClient`` run, its sub-agents (the Agent /
Task tool) and its MCP tool calls are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``claude-agent-sdk``), or in code:
``ClaudeAgentSDKInstrumentor().instrument()``. The SDK runs the Claude Code CLI as a subprocess; the
guard is a set of the SDK's own hooks (``PreToolUse``, ``PostToolUse``, ``SubagentStart`` ...) that
every run gets besides the app's: a refused sub-agent or tool call is a ``PreToolUse`` deny whose
reason is the refusal's text, which the CLI hands to the model as the call's error. What is a hop,
what the model sees, what is left out: docs/runtimes/claude-agent-sdk.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.claude_agent_sdk.package import _instruments

_QUERY: Final = "claude_agent_sdk._internal.query"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Every run (query() and ClaudeSDKClient alike) makes one Query: the guard's hooks join its own.
    (_QUERY, "Query.__init__"),
    # Where the run starts reading the CLI: the run's hop is decided, and its tasks start inside it.
    (_QUERY, "Query.start"),
    # Where the run ends, however it ends: its hops end.
    (_QUERY, "Query.close"),
    # Where every SDK MCP server's tools are built: a refusal inside a tool is the tool's error result.
    ("claude_agent_sdk", "create_sdk_mcp_server"),
    # The MCP server class the SDK builds its tool servers with: each tool call runs in its hop.
    ("claude_agent_sdk._internal._mcp_compat", "_Server"),
)
"""Every (module, attribute) this instrumentor wraps."""

QUERY_METHODS: Final = PATCH_TARGETS[:3]
"""The ``Query`` methods, replaced by plain functions that call them (the others are ``wrapt`` patches):
the SDK calls them several times a run (it closes a run's Query four times), and a plain function in
the class's slot is bound in C, where a ``wrapt`` proxy is made at each read."""

SERVER_FACTORIES: Final = PATCH_TARGETS[3:]
"""What builds the SDK's MCP tool servers: ``wrapt`` patches (called once a server)."""


class ClaudeAgentSDKInstrumentor(GuardInstrumentor):
    """Makes Claude Agent SDK runs, sub-agents and MCP tool calls guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation._replacements import replace
        from otel_guard.instrumentation.claude_agent_sdk import _runs, _tools

        init, start, close = QUERY_METHODS
        replace(init, _runs.initializing)
        replace(start, _runs.starting)
        replace(close, _runs.closing)
        for target, wrapper in zip(
            SERVER_FACTORIES, (_tools.new_sdk_server, _tools.new_tool_server), strict=True
        ):
            wrap_function_wrapper(*target, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation._replacements import restore

        for target in QUERY_METHODS:
            restore(target)
        unwrap_all(SERVER_FACTORIES)
