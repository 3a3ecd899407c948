"""An MCP server over stdio, run in a process of its own, with one tool that reports what came with
the call: the W3C ``baggage`` of the request's ``_meta``, where Strands' ``MCPClient`` puts the
caller's OpenTelemetry context (and with it the delegation chain)."""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("venues")


@server.tool()
def find_venue(city: str, ctx: Context) -> str:
    """Find a venue for the offsite in a city."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("baggage") or "")


if __name__ == "__main__":
    server.run("stdio")
