"""SDK MCP tools: each call is decided and runs in its hop, and a refusal is the tool's error result.

The server class the SDK builds its tool servers with (``_mcp_compat._Server``) is wrapped so that
its ``on_call_tool`` runs each tool inside the context of the call's hop, found by the request's
``claudecode/toolUseId`` (:mod:`._scope`): a run the tool starts (an agent it asks) is inside the call.
The CLI asks no hook about such a server's tools (while no model budget is on), so the hop is decided
here, by the run the server serves, in the context of the agent that made the call (:mod:`._runs`);
a refused call is not run: its answer is the SDK's own tool error result (``isError``) whose text is
:func:`refusal_text`, which the CLI hands the model as the call's result. A call decided in the run's
``PreToolUse`` hook (with a model budget on) comes with its hop open. The hop ends when the tool
returns, with an error when its result is one; no ``PostToolUse`` hook is asked about these tools.

A refusal raised inside a tool (the agent it asks was refused) would come back as the SDK's error
result with the exception's bare message; ``create_sdk_mcp_server`` is wrapped so that each tool's
handler answers a refusal with the SDK's error result (``is_error``) whose text is
:func:`refusal_text`, and the model answers with what it has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, cast

from mcp.types import CallToolResult
from opentelemetry import context as otel_context

from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.claude_agent_sdk._scope import (
    ENDING_SERVERS,
    OPEN_CALLS,
    SERVING,
    tool_use_id_of,
)

Handler = Callable[[Any], Awaitable[dict[str, Any]]]


def new_sdk_server(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``create_sdk_mcp_server(name, version, tools)``: the tools' handlers answer refusals."""
    if "tools" in kwargs:
        kwargs = {**kwargs, "tools": _answering(kwargs["tools"])}
    elif len(args) > 2:
        args = (*args[:2], _answering(args[2]), *args[3:])
    return wrapped(*args, **kwargs)


def _answering(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools
    return [_answering_tool(tool) for tool in tools]


def _answering_tool(tool: Any) -> Any:
    """``tool`` (an ``SdkMcpTool``) with a handler that answers refusals."""
    handler = getattr(tool, "handler", None)
    if not callable(handler) or isinstance(tool, type) or not dataclasses.is_dataclass(tool):
        return tool
    replaced: Any = dataclasses.replace(cast(Any, tool), handler=_answers_refusals(handler))
    return replaced


def _answers_refusals(handler: Handler) -> Handler:
    async def handle(arguments: Any) -> dict[str, Any]:
        try:
            return await handler(arguments)
        except Exception as exc:
            err = refusal_behind(exc)
            if err is None:
                raise
            return {"content": [{"type": "text", "text": refusal_text(err)}], "is_error": True}

    handle.__wrapped__ = handler  # type: ignore[attr-defined]
    return handle


def new_tool_server(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_Server(name, ..., on_call_tool=...)``: each tool call runs in its hop's context and ends it."""
    on_call_tool = kwargs.get("on_call_tool")
    if on_call_tool is None:
        return wrapped(*args, **kwargs)
    server = wrapped(*args, **{**kwargs, "on_call_tool": _in_hop(on_call_tool)})
    ENDING_SERVERS.add(server)
    return server


def _in_hop(on_call_tool: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def call_tool(ctx: Any, params: Any) -> Any:
        tool_use_id = tool_use_id_of(params)
        if tool_use_id is None:
            return await on_call_tool(ctx, params)
        call = OPEN_CALLS.get(tool_use_id)
        if call is None:
            run, tool = SERVING.get(), getattr(params, "name", None)
            if run is None or not isinstance(tool, str):
                return await on_call_tool(ctx, params)
            decided = await run.open_call(tool_use_id, tool)
            if decided is None:
                return await on_call_tool(ctx, params)
            if isinstance(decided, str):
                return _error_result(decided)
            call = decided
        token = otel_context.attach(call.context)
        try:
            result = await on_call_tool(ctx, params)
        except BaseException as exc:
            otel_context.detach(token)
            call.end(exc)
            raise
        otel_context.detach(token)
        call.end(_failure(result))
        return result

    return call_tool


def _error_result(text: str) -> CallToolResult:
    """The SDK's own error result of a tool call (as its ``_tool_error_result`` makes it)."""
    return CallToolResult.model_validate({"content": [{"type": "text", "text": text}], "isError": True})


def _failure(result: Any) -> BaseException | None:
    """The error a tool's result reports (``isError``, with its text), or ``None``."""
    # mcp 2 names the field ``is_error`` (``isError`` its alias on the wire), mcp 1 ``isError``.
    failed = getattr(result, "is_error", None)
    if (getattr(result, "isError", False) if failed is None else failed) is not True:
        return None
    texts = [
        text
        for block in getattr(result, "content", None) or ()
        if isinstance(text := getattr(block, "text", None), str)
    ]
    return RuntimeError(" ".join(texts) or "tool call failed")
