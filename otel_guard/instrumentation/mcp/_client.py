"""The client side: ``ClientSession.call_tool`` is a hop ``execute_tool {tool}``.

The hop's span is the GenAI ``execute_tool`` span of the call (INTERNAL, as the conventions define
it) with the MCP attributes known before the request is sent (``mcp.method.name``,
``mcp.protocol.version``); the SDK's own CLIENT span of the request (``MCP send tools/call {tool}``,
with its ``jsonrpc.request.id``, which the SDK picks only as it sends) is its child.

The hop is checked before the request is sent, and the request is sent inside it: its ``_meta`` gets
the trace context and the new chain (MCP's JSON-RPC dispatcher injects them; see :mod:`._carrier`),
and the server checks the same chain again before the tool body runs. A refused call is never sent:
``call_tool`` returns the tool error :func:`refusal_result` instead, the same result a refusing
server would have sent back.

Every MCP client built on ``ClientSession`` goes through here: ``mcp.Client``, ``ClientSessionGroup``,
and the MCP adapters of agent frameworks (the OpenAI Agents SDK's ``MCPServer*`` classes call
``session.call_tool``).

In one process, through a direct dispatcher (``mcp.Client(server)``'s default), the server runs in
the caller's own context: the hop is handed over (:mod:`._in_process`) instead of written into
``_meta``, and the server runs the tool body inside it without deciding it again.

One call is one hop. When the chain in force already ends with this tool -- an agent framework
opened the ``execute_tool {tool}`` hop for this very call before handing it to its MCP adapter --
the call joins that hop instead of adding the tool to the chain a second time (which would be a
false cycle). The one exception is a tool body calling its own tool again: the hop in force is then
the one this process is serving, and the call is a new hop (a real cycle, refused as one).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry.context import Context, attach, detach, get_current

from otel_guard._carriers import propagator_reads_baggage
from otel_guard._in_force import chain_in
from otel_guard.chain import Chain, ChainToken
from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation.mcp._carrier import meta_with_chain, meta_with_context, writes_trace_context
from otel_guard.instrumentation.mcp._context import chain_value, suppressed
from otel_guard.instrumentation.mcp._in_process import (
    DIRECT_DISPATCHER,
    DISPATCHER_ATTRIBUTE,
    handed_over,
    serving_handed_over,
)
from otel_guard.instrumentation.mcp._refusal import refusal_result
from otel_guard.instrumentation.mcp._server import TOOLS_CALL, serving_chain
from otel_guard.telemetry import MCP_METHOD_NAME, MCP_PROTOCOL_VERSION

CallTool = Callable[..., Awaitable[Any]]
"""``ClientSession.call_tool(self, name, arguments=None, ..., *, meta=None, ...)``."""


def guarding_call_tool(call_tool: CallTool) -> CallTool:
    """The function that takes ``ClientSession.call_tool``'s place: each call a hop (see the module)."""

    async def guarded_call_tool(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        current = get_current()
        if suppressed(current):
            return await call_tool(self, *args, **kwargs)
        tool = args[0] if args else kwargs.get("name")
        if not isinstance(tool, str) or not tool:
            return await call_tool(self, *args, **kwargs)
        # ``dispatches_directly(self)`` inline: this runs on every call.
        direct = DIRECT_DISPATCHER is not None and isinstance(
            getattr(self, DISPATCHER_ATTRIBUTE, None), DIRECT_DISPATCHER
        )
        in_force = chain_value(current)
        # The usual case first, inline: the hop in force is another's (read off a token made here).
        if (
            in_force is not None
            and (type(in_force) is not ChainToken or in_force.agents[-1] == tool)
            and (joined := _enclosing_hop_of(tool, current)) is not None
        ):
            return await _send(call_tool, self, args, kwargs, tool, joined, direct)
        # The hop's steps inline (as ``async with`` would take them): this runs on every call.
        hop = delegate(tool, kind="tool", attributes=_call_attributes(self))
        try:
            ctx = await hop.astart()
        except DelegationRefused as err:
            return refusal_result(err)
        token = attach(ctx)
        handover = None
        if direct:
            handover = handed_over.set([tool, chain_value(ctx), None, False])  # a Handover: the hop's token
        else:
            _write_meta(self, kwargs)
        try:
            result = await call_tool(self, *args, **kwargs)
        except BaseException as exc:  # the session's refusal too: not this hop's, let it through
            if handover is not None:
                handed_over.reset(handover)
            detach(token)
            hop.finish(exc)
            raise
        if handover is not None:
            handed_over.reset(handover)
        detach(token)
        hop.finish()
        return result

    return guarded_call_tool


async def _send(
    call_tool: CallTool,
    session: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    tool: str,
    chain: Chain,
    direct: bool,
) -> Any:
    """Send a call that joined the hop in force (whose chain is ``chain``): handed over to a server in
    this context, else in ``_meta``."""
    if direct:
        handover = handed_over.set([tool, chain_value(get_current()), chain, False])  # a Handover
        try:
            return await call_tool(session, *args, **kwargs)
        finally:
            handed_over.reset(handover)
    _write_meta(session, kwargs)
    return await call_tool(session, *args, **kwargs)


def _write_meta(session: object, kwargs: dict[str, Any]) -> None:
    """Put the hop's context into the request's ``_meta``, unless MCP's dispatcher will itself."""
    if not writes_trace_context(session):
        kwargs["meta"] = meta_with_context(kwargs.get("meta"))
    elif not propagator_reads_baggage():
        kwargs["meta"] = meta_with_chain(kwargs.get("meta"))  # MCP's injection leaves it out


_ATTRIBUTES: dict[str, dict[str, str]] = {}
"""The MCP attributes of a ``tools/call``, by the session's protocol version (a handful of them)."""


def _call_attributes(session: object) -> Mapping[str, str]:
    """The MCP attributes of a ``tools/call`` on ``session``, before it is sent: one dict per protocol
    version, shared by every call and never changed (the guard copies a hop's attributes into the
    span's). A dict, not a read-only proxy: a hop copies it, and a proxy copies three times slower."""
    version = getattr(session, "protocol_version", None)
    if not isinstance(version, str):
        version = ""  # not negotiated yet: no mcp.protocol.version
    attributes = _ATTRIBUTES.get(version)
    if attributes is None:
        attributes = {MCP_METHOD_NAME: TOOLS_CALL}
        if version:
            attributes[MCP_PROTOCOL_VERSION] = version
        if len(_ATTRIBUTES) < 16:  # a peer can name any version: never more than a few kept
            _ATTRIBUTES[version] = attributes
    return attributes


def _enclosing_hop_of(tool: str, current: Context) -> Chain | None:
    """The chain of the hop in force in ``current`` when that hop is this very call's, opened by an
    agent framework around it: it ends with ``tool`` and is not the one this context is serving."""
    chain = chain_in(current)
    if chain is None or chain.hops[-1].agent != tool:
        return None
    if chain == serving_chain.get() or serving_handed_over(chain):  # a body calling its own tool
        return None
    return chain
