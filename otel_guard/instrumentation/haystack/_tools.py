"""Tool calls as hops: ``Tool.invoke`` and ``Tool.invoke_async``, and what a refusal gives the model.

An Agent's tool step calls ``tool.invoke(**args)`` (in a worker thread, the step's context copied
into it) or ``await tool.invoke_async(**args)``; direct calls go the same way. A call is a hop:

* a tool that runs an Agent (``AgentTool``, or a ``ComponentTool`` whose component is an ``Agent``)
  is ``invoke_agent {tool.name}``, and the agent's run inside it joins it: an agent called as a tool
  is one hop into that agent, under the name its caller's model calls it by;
* any other tool (a ``PipelineTool``, a ``ComponentTool``, a function ``Tool``) is
  ``execute_tool {tool.name}``; an Agent run named like it inside (a pipeline component named like
  the tool) joins it.

``invoke_async`` of a tool with no ``async_function`` runs ``invoke`` in a thread: that ``invoke``
is the call's hop, not a second one.

A refused call never runs its body. Haystack hands a tool's failure to the model as an error tool
result when the tool raises ``ToolInvocationError`` (its other exceptions end the run): the refused
call raises one whose message is :func:`refusal_text`, with the ``DelegationRefused`` as its cause,
and the model reads it and answers. A refusal inside the tool (a nested Agent run, a pipeline's
Agent) fails the call the same way, in place of Haystack's "Failed to invoke Tool ... Error: ...".
With ``raise_on_tool_invocation_failure=True`` Haystack raises the error from the run instead, as it
does for any tool's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from haystack.components.agents import Agent
from haystack.tools.component_tool import ComponentTool
from haystack.tools.errors import ToolInvocationError
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.haystack._scope import Call, with_values


def hop_of(tool: Any) -> tuple[str, Literal["agent", "tool"], Any] | None:
    """(hop name, kind, the Agent the tool runs or ``None``) of a call of ``tool``; ``None``: no hop."""
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not name:
        return None
    component = getattr(tool, "_component", None) if isinstance(tool, ComponentTool) else None
    if isinstance(component, Agent):
        return name, "agent", component
    return name, "tool", None


def refused_error(name: str, err: DelegationRefused) -> ToolInvocationError:
    """A refusal as Haystack's own tool failure, which it hands to the model as an error result."""
    error = ToolInvocationError(refusal_text(err), tool_name=name)
    error.__cause__ = err
    return error


def _with_refusal_text(name: str, error: ToolInvocationError) -> ToolInvocationError:
    """The call's failure, with the refusal's text when a refusal inside the tool caused it."""
    err = refusal_behind(error.__cause__)
    return error if err is None else refused_error(name, err)


def guard_invoke(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Tool.invoke``: the call is one hop."""
    target = hop_of(instance) if is_instrumentation_enabled() else None
    if target is None:
        return wrapped(*args, **kwargs)
    name, kind, agent = target
    hop = delegate(name, kind=kind)
    try:
        ctx = hop.start()
    except DelegationRefused as err:
        raise refused_error(name, err) from err
    token = otel_context.attach(with_values(ctx, call=Call(name, agent)))
    try:
        result = wrapped(*args, **kwargs)
    except ToolInvocationError as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise _with_refusal_text(name, exc) from exc.__cause__
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
    hop.finish()
    return result


async def guard_invoke_async(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Tool.invoke_async``: the call is one hop (for a sync tool, the ``invoke`` it runs is)."""
    target = hop_of(instance) if is_instrumentation_enabled() else None
    if target is None or getattr(instance, "async_function", None) is None:
        return await wrapped(*args, **kwargs)
    name, kind, agent = target
    hop = delegate(name, kind=kind)
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        raise refused_error(name, err) from err
    token = otel_context.attach(with_values(ctx, call=Call(name, agent)))
    try:
        result = await wrapped(*args, **kwargs)
    except ToolInvocationError as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise _with_refusal_text(name, exc) from exc.__cause__
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
    hop.finish()
    return result
