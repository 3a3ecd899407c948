"""An MCP server (stdio) for the OpenAI Agents SDK tests: one tool that reports the chain it sees.

Started by the test through the SDK's ``MCPServerStdio``, under ``opentelemetry-instrument`` so the
MCP instrumentation checks every incoming call again. stdout is the MCP transport: nothing else may
print there (the test sets ``OTEL_TRACES_EXPORTER=none``).
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

import otel_guard

server = MCPServer("lookup-server")


@server.tool()
def lookup(input: str) -> str:
    """Look something up."""
    chain = otel_guard.current_chain()
    return "chain: " + (" > ".join(hop.agent for hop in chain.hops) if chain else "none")


if __name__ == "__main__":
    server.run()
