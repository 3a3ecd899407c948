"""An MCP server whose two tools delegate to each other: planner -> budget -> planner -> ...

Each tool body records that it ran, then calls the other tool through an MCP client, so without a
guard the two bounce until ``rounds`` runs out (the bound that keeps an unguarded run finite). A tool
reaches its peer at ``there`` (a streamable-HTTP URL, or ``"inproc"`` for this very server object)
and tells it to call back at ``here``. The answer a tool returns quotes what its call brought back,
so a refusal deep in the loop shows in the outermost answer.

Used in-process by the tests (:func:`build_server`) and as a program, the way a user runs one::

    opentelemetry-instrument python mcp_app.py --port-file PATH

which serves streamable HTTP on 127.0.0.1 at a free port and writes the port to ``PATH`` once it
listens. Every tool body that runs prints ``mcp_app: ran <tool>`` to stderr.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

import mcp_types
import uvicorn
from mcp import Client
from mcp.server.mcpserver import MCPServer

INPROC = "inproc"
ROUNDS = 6
"""Enough rounds that an unguarded loop visibly bounces several times, few enough to stay quick."""


def answer_text(result: mcp_types.CallToolResult) -> str:
    """The text a caller reads from a tool result, marked when the tool reported an error."""
    text = " ".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent))
    return f"[tool error] {text}" if result.is_error else text


def build_server(ran: list[str] | None = None, *, mode: str = "auto") -> MCPServer:
    """The planner/budget server; each body that runs appends its tool name to ``ran``.

    ``mode`` is how an in-process call connects (``mcp.Client`` modes: ``"auto"`` dispatches
    directly, ``"legacy"`` goes through JSON-RPC over memory streams).
    """
    server = MCPServer("planner-budget")
    log = ran if ran is not None else []

    def connect(url: str) -> Client:
        return Client(server, mode=mode) if url == INPROC else Client(url)

    async def delegate_to(tool: str, rounds: int, here: str, there: str) -> str:
        async with connect(there) as client:
            result = await client.call_tool(tool, {"rounds": rounds - 1, "here": there, "there": here})
        return answer_text(result)

    @server.tool()
    async def planner(rounds: int = ROUNDS, here: str = INPROC, there: str = INPROC) -> str:
        """Plan a trip; asks budget what it may cost."""
        log.append("planner")
        print("mcp_app: ran planner", file=sys.stderr, flush=True)
        if rounds <= 0:
            return "planner: out of rounds"
        return f"plan, with budget saying: {await delegate_to('budget', rounds, here, there)}"

    @server.tool()
    async def budget(rounds: int = ROUNDS, here: str = INPROC, there: str = INPROC) -> str:
        """Price a plan; asks planner to re-plan first."""
        log.append("budget")
        print("mcp_app: ran budget", file=sys.stderr, flush=True)
        if rounds <= 0:
            return "budget: out of rounds"
        return f"budget, after planner said: {await delegate_to('planner', rounds, here, there)}"

    return server


def listening_socket() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1.

    It listens before the server starts, so a client that connects early waits in the backlog
    until the server (and its lifespan) is up, instead of being refused.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def http_server(server: MCPServer, **config: Any) -> uvicorn.Server:
    """A uvicorn server for ``server``'s streamable-HTTP app (its lifespan runs the sessions)."""
    app = server.streamable_http_app()
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **config))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", required=True, help="where to write the port once listening")
    args = parser.parse_args()
    sock = listening_socket()
    # Written atomically, so a reader never sees half a port number.
    partial = f"{args.port_file}.tmp"
    with open(partial, "w") as out:
        out.write(str(sock.getsockname()[1]))
    os.replace(partial, args.port_file)
    http_server(build_server()).run(sockets=[sock])


if __name__ == "__main__":
    main()
