"""The floor under the MCP rows of ``runtime_overhead.py``: the guard's hops of one call, no MCP at all.

Each builder is a ``Runtime`` whose bare arm does nothing and whose guarded arm makes, with
``delegate`` and the global propagator only, what a guarded MCP call must make whatever its adapter:

* ``root_hop``: the client's hop of an in-process call (a root ``execute_tool`` hop with the two MCP
  attributes known before sending), attached as the adapter attaches it;
* ``nested_hop``: the same hop made inside an agent's hop open for the round (a nested, lean hop);
* ``wire_hops`` / ``wire_hops_nested``: the two hops of a call over a transport: the client's hop,
  its context injected into a ``_meta`` dict (traceparent, baggage with the signed chain), extracted
  again and checked by the server's receiving hop with the server's three MCP attributes.

Run with ``runtime_overhead.py --instructions --runtime mcp-floor-root`` (and the others' names).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context, propagate

import otel_guard

# the installed mcp's mcp.types.LATEST_PROTOCOL_VERSION, which the bench's sessions negotiate
CLIENT = {"mcp.method.name": "tools/call", "mcp.protocol.version": "2026-07-28"}
SERVER = {**CLIENT, "jsonrpc.request.id": "1"}


def _build(runtime: type, name: str, wire: bool, nested: bool) -> Any:
    guarded = [False]
    held: dict[str, Any] = {}

    async def run() -> str:
        if not guarded[0]:
            return "sunny"
        hop = otel_guard.delegate("lookup", kind="tool", attributes=CLIENT)
        token = context.attach(await hop.astart())
        if wire:
            meta: dict[str, str] = {}
            propagate.inject(meta)
            server_token = context.attach(propagate.extract(meta))
            served = otel_guard.delegate("lookup", kind="tool", receiving=True, attributes=SERVER)
            served_token = context.attach(await served.astart())
            context.detach(served_token)
            served.finish()
            context.detach(server_token)
        context.detach(token)
        hop.finish()
        return "sunny"

    def switch(on: bool) -> None:
        guarded[0] = on

    async def open_round() -> None:
        if nested and guarded[0]:
            hop = otel_guard.delegate("planner")
            held["hop"], held["token"] = hop, context.attach(await hop.astart())

    async def close_round() -> None:
        hop = held.pop("hop", None)
        if hop is not None:
            context.detach(held.pop("token"))
            hop.finish()

    return runtime(name, run, None, lambda out: out == "sunny", open_round, close_round, switch)


def root_hop(runtime: type) -> Any:
    return _build(runtime, "mcp-floor-root", wire=False, nested=False)


def nested_hop(runtime: type) -> Any:
    return _build(runtime, "mcp-floor-nested", wire=False, nested=True)


def wire_hops(runtime: type) -> Any:
    return _build(runtime, "mcp-floor-wire", wire=True, nested=False)


def wire_hops_nested(runtime: type) -> Any:
    return _build(runtime, "mcp-floor-wire-nested", wire=True, nested=True)
