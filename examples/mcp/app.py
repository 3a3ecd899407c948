"""Planner and budget: two MCP servers whose tools ask each other, each tool body a scripted model.

The planner asks the budget server what the offsite costs; the budget server asks the planner what
the plan is; the planner asks the budget server again, and so on. With a real model behind each
tool, that is the loop that burns money. Here each tool body is the script: it calls the other
server's tool (one MCP ``tools/call``, through an ``mcp.Client`` session) whenever it is called, and
answers in text once that call's result is back. The scripts stop after ``MAX_TOOL_CALLS`` tool
calls, so that the program ends even when nothing stops the loop. Both servers run in this process
(``Client(server)`` connects in-process): no network, no subprocess.

Without the guard (``python examples/mcp/app.py``) the servers bounce until the scripts give up.
Under the guard, with no change to this file::

    pip install '.[mcp]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/mcp/app.py

the budget tool's call back into the planner is refused (the planner is already on the path, which
each request's ``_meta`` carries): nothing is sent, and the budget tool gets an MCP tool error
(``isError``) that says why, reads it and answers with what it has, and so does the planner. The
spans, the guard's among them, are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent

MAX_TOOL_CALLS = 6  # in all, both servers: where the scripts give up when nothing else stops them
tool_calls = 0


def text_of(result: CallToolResult) -> str:
    """What a tool result says: the text of its content blocks."""
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


def scripted_server(agent: str, peer: str) -> MCPServer:
    """An MCP server named ``agent`` whose one tool, also ``agent``, asks ``peer``'s tool, then answers.

    The tool is named after its agent because the guard names each hop after the tool called: the
    chain then reads ``planner -> budget``, and a second ``planner`` in it is the cycle.
    """
    server = MCPServer(agent)

    @server.tool(name=agent, description=f"Ask the {agent} agent.")
    async def ask(question: str) -> str:
        global tool_calls
        if tool_calls >= MAX_TOOL_CALLS:
            print(f"{agent}: the script gives up")
            return f"{agent} gives up"
        tool_calls += 1
        print(f"{agent} calls {peer} (tool call {tool_calls})")
        # A fresh in-process session to the peer, as a tool would open to any MCP server it uses.
        async with Client(servers[peer]) as client:
            result = await client.call_tool(peer, {"question": f"asked by {agent}"})
        # A refused call is not an exception: it comes back as a tool error, which the script reads.
        outcome = "error" if result.is_error else "success"
        print(f"  {agent} got {peer}'s {outcome} result: {text_of(result)[:160]}")
        return f"{agent}'s answer, from what {peer} said"

    return server


servers = {"planner": scripted_server("planner", "budget"), "budget": scripted_server("budget", "planner")}


async def main() -> None:
    # The user's request: an MCP call too (the chain's first hop), but not one of the agents' tool calls.
    async with Client(servers["planner"]) as client:
        answer = text_of(await client.call_tool("planner", {"question": "Plan the team offsite"}))
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    asyncio.run(main())
