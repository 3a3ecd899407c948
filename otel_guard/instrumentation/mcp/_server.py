"""The server side: every ``tools/call`` a low-level ``Server`` (or an ``MCPServer``) serves is a hop.

The runner looks the handler up with ``Server.get_request_handler(method)`` for each request; for
``tools/call`` the patched lookup hands back the same handler wrapped in a guard. The guard reads the
caller's context from the request's ``_meta``, checks the hop with
``delegate(tool, kind="tool", receiving=True)`` and only then runs the handler. A refusal becomes
the tool error :func:`refusal_result`; the handler (and so the tool body) never runs. The hop's span
is the GenAI ``execute_tool`` span (INTERNAL: the tool runs here) with the request's MCP attributes
(``mcp.method.name``, ``jsonrpc.request.id``, ``mcp.protocol.version``).

A call this process made through a direct dispatcher runs here in the caller's own context, inside
the caller's hop (:mod:`._in_process`): the guard finds that hop handed over and runs the
handler in it, with no second decision, span or reading of ``_meta`` (and, for ``MCPServer``'s
handler, no frame of its own around it: the runner awaits the handler's own coroutine).

``MCPServer`` registers its tool dispatcher as that same ``tools/call`` handler, so its tools are
guarded the same way. MCP's own ``OpenTelemetryMiddleware`` runs outside the handler: its
``tools/call {tool}`` span is the parent of the hop's ``execute_tool {tool}`` span.

A refusal can also come from *inside* a tool body: a deeper hop (``@agentic``, another runtime's
agent run) refused and the body let it through. ``MCPServer`` would report that as its generic
"Error executing tool ..." (the exception's own text stays on the server), which a model cannot act
on; :func:`keeping_refusal_text` re-raises it from ``MCPServer.call_tool`` as a ``ToolError`` carrying the
refusal text, which ``MCPServer`` hands to the caller as the tool's error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Final

from mcp.server.context import HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import HandlerEntry
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from opentelemetry import context
from opentelemetry.context import Context

from otel_guard.chain import Chain
from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.mcp._carrier import context_from_meta
from otel_guard.instrumentation.mcp._context import chain_value, suppressed
from otel_guard.instrumentation.mcp._in_process import CHAIN_VALUE, TAKEN, TOOL, handed_over
from otel_guard.instrumentation.mcp._refusal import refusal_result
from otel_guard.telemetry import JSONRPC_REQUEST_ID, MCP_METHOD_NAME, MCP_PROTOCOL_VERSION

TOOLS_CALL: Final = "tools/call"

Handler = Callable[[ServerRequestContext[Any, Any], Any], Awaitable[HandlerResult]]

serving_chain: ContextVar[Chain | None] = ContextVar("otel_guard_mcp_serving_chain", default=None)
"""The chain of the ``tools/call`` this context is serving (the client side reads it)."""


GetRequestHandler = Callable[[Any, str], "HandlerEntry[Any] | None"]
"""``Server.get_request_handler(self, method)``."""


def guarding_request_handler(get_request_handler: GetRequestHandler) -> GetRequestHandler:
    """The function that takes ``Server.get_request_handler``'s place: the ``tools/call`` handler it
    looks up comes back guarded (the same guarded entry for the same entry), every other as it is."""

    def guarded_get_request_handler(self: Any, method: str) -> HandlerEntry[Any] | None:
        entry = get_request_handler(self, method)
        if entry is None or method != TOOLS_CALL:
            return entry
        known = _GUARDED.get(id(entry))  # looked up here, not in a call: it runs on every request
        if known is not None and known[0] is entry:
            return known[1]
        return _guard_entry(entry)

    return guarded_get_request_handler


_GUARDED: dict[int, tuple[HandlerEntry[Any], HandlerEntry[Any]]] = {}
"""The guarded entry of each ``tools/call`` entry looked up, by the entry's id (the entry kept with
it, so the id stays its own); a server has one such entry, a program a few servers."""


def _guard_entry(entry: HandlerEntry[Any]) -> HandlerEntry[Any]:
    """``entry`` with its handler guarded, kept for the next lookup of the same entry."""
    guarded = HandlerEntry(entry.params_type, _guarded(entry.handler))
    if len(_GUARDED) >= 64:  # handlers registered again and again: never more than a few kept
        _GUARDED.clear()
    _GUARDED[id(entry)] = (entry, guarded)
    return guarded


_ANSWERING_HANDLER: Final = getattr(MCPServer, "_handle_call_tool", None)
"""``MCPServer``'s ``tools/call`` handler: it answers every failure of a tool as the tool's error (a
refusal inside the body with its text, :func:`keeping_refusal_text`), so no refusal escapes it."""


def _answers_every_failure(handler: Handler) -> bool:
    """Whether ``handler`` is an ``MCPServer``'s own ``tools/call`` handler (see above)."""
    return _ANSWERING_HANDLER is not None and getattr(handler, "__func__", None) is _ANSWERING_HANDLER


def _guarded(handler: Handler) -> Handler:
    """``handler`` guarded. The guard is a plain function that hands back the handler's own awaitable
    where it has nothing to do around it (suppressed, no tool name, a call handed over to a handler
    that lets no refusal escape), and a coroutine that checks the hop around it otherwise."""
    answers = _answers_every_failure(handler)

    def guarded_call_tool(ctx: ServerRequestContext[Any, Any], params: Any) -> Awaitable[HandlerResult]:
        current = context.get_current()
        tool = getattr(params, "name", None)
        # Asked before suppression: only a client guard that was not suppressed in this very context
        # hands a call over, and this is the path every in-process call takes.
        # ``take_over(tool, current)`` inline: the one step every in-process call takes here.
        handover = handed_over.get()
        if (
            handover is not None
            and not handover[TAKEN]
            and handover[TOOL] == tool
            and chain_value(current) is handover[CHAIN_VALUE]
        ):
            handover[TAKEN] = True
            # The caller's hop, which the caller decided and this context is in: run the body in it.
            return handler(ctx, params) if answers else _in_handover(handler, ctx, params)
        if suppressed(current) or not isinstance(tool, str) or not tool:
            # Suppressed, or not a tool call this guard can name (the handler rejects it as it
            # always would).
            return handler(ctx, params)
        return _in_hop(handler, ctx, params, tool, current)

    return guarded_call_tool


async def _in_handover(handler: Handler, ctx: ServerRequestContext[Any, Any], params: Any) -> HandlerResult:
    """Run a handed-over call's handler, a refusal inside its body answered as the tool's error."""
    try:
        return await handler(ctx, params)
    except DelegationRefused as err:  # a deeper hop refused inside the body, let through
        return refusal_result(err)


async def _in_hop(
    handler: Handler, ctx: ServerRequestContext[Any, Any], params: Any, tool: str, current: Context
) -> HandlerResult:
    """Check the hop of a call that arrived with its chain in ``_meta``; run the handler in it."""
    meta: Mapping[str, Any] | None = ctx.meta
    if meta is None:
        meta = getattr(params, "meta", None)
    token = context.attach(context_from_meta(meta, current))
    # The hop's steps inline (as ``async with`` would take them): this runs on every request.
    hop = delegate(tool, kind="tool", receiving=True, attributes=_request_attributes(ctx))
    try:
        try:
            hop_token = context.attach(await hop.astart())
        except DelegationRefused as err:  # refused on entry: the body never runs
            return refusal_result(err)
        serving = serving_chain.set(hop.chain)
        try:
            result = await handler(ctx, params)
        except BaseException as exc:
            serving_chain.reset(serving)
            context.detach(hop_token)
            hop.finish(exc)
            if isinstance(exc, DelegationRefused):
                # A deeper hop refused inside the body, which left it unhandled: the model
                # gets the refusal as this tool's error.
                return refusal_result(exc)
            raise
        serving_chain.reset(serving)
        context.detach(hop_token)
        hop.finish()
        return result
    finally:
        context.detach(token)


def _request_attributes(ctx: ServerRequestContext[Any, Any]) -> dict[str, str]:
    """The MCP attributes of the request ``ctx`` serves."""
    attributes = {MCP_METHOD_NAME: ctx.method}
    if ctx.request_id is not None:
        attributes[JSONRPC_REQUEST_ID] = str(ctx.request_id)
    if ctx.protocol_version:
        attributes[MCP_PROTOCOL_VERSION] = ctx.protocol_version
    return attributes


MCPServerCallTool = Callable[..., Awaitable[Any]]
"""``MCPServer.call_tool(self, name, arguments, context=None)``."""


def keeping_refusal_text(call_tool: MCPServerCallTool) -> MCPServerCallTool:
    """The function that takes ``MCPServer.call_tool``'s place: a refusal in a tool body keeps its text.

    Suppression is checked only when the call fails (the context is the call's either way), so a
    call that succeeds pays for nothing but this coroutine.
    """

    async def call_tool_keeping_refusal_text(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return await call_tool(self, *args, **kwargs)
        except ToolError as exc:
            refused = refusal_behind(exc)
            if refused is None or suppressed(context.get_current()):
                raise
            raise ToolError(refusal_text(refused)) from exc

    return call_tool_keeping_refusal_text
