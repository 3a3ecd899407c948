"""Tool calls as hops: a ``FunctionMiddleware`` in every guarded run's function middleware.

Agent Framework runs every function call the model asks for through the run's function middleware
pipeline, whose last link invokes the tool (and opens Agent Framework's own ``execute_tool`` span).
The guard's :class:`ToolCalls` is added to each guarded run's pipeline by the run's agent middleware
(:mod:`._runs`), after the chat client's, the agent's and the run's own function middleware (a context
provider's comes after it): a call one of those answered or stopped is no hop (nothing was delegated).

Which hop a call is (:func:`hop_of`):

* an agent offered as a tool (``agent.as_tool()``) is a hop into that agent, ``invoke_agent
  {agent name}``, whatever the tool is called, and the agent's run inside it joins that hop;
* any other tool is ``execute_tool {tool name}``; an agent run of the same name inside it joins it.

What a refusal looks like. Agent Framework hides a failed tool's exception from the model (it sends
``"Error: Function failed."`` unless ``include_detailed_errors`` is on), so the guard never lets a
refusal fail the call: it writes :func:`refusal_text` into the call's result instead. A refused call's
body never runs; a call whose body raised a refusal (a tool whose agent run was refused) gets the same
text as its result. The model reads it and the run goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from agent_framework import FunctionInvocationContext, FunctionMiddleware, MiddlewareTermination
from opentelemetry import context as otel_context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.agent_framework._handoffs import is_handoff
from otel_guard.instrumentation.agent_framework._scope import CALL, Call, agent_name, guarding

AGENT_TOOL: Final = "BaseAgent.as_tool.<locals>._agent_wrapper"
"""The qualified name of the function ``BaseAgent.as_tool`` wraps an agent in (it closes over it)."""


def agent_behind(tool: Any) -> Any | None:
    """The agent a tool made by ``agent.as_tool()`` runs, or ``None`` for any other tool.

    ``as_tool`` keeps no reference to its agent on the tool: the function it wraps closes over it.
    """
    func: Any = getattr(tool, "func", None)
    if getattr(func, "__qualname__", None) != AGENT_TOOL:
        return None
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=False):
        if name == "self":
            return cell.cell_contents
    return None


def hop_of(tool: Any) -> tuple[str, Literal["agent", "tool"]] | None:
    """(hop name, kind) for a call of ``tool``; ``None``: no hop (a tool without a name, or a
    handoff workflow's handoff tool: the handoff is the hop, :mod:`._handoffs`)."""
    if is_handoff(tool):
        return None
    agent = agent_behind(tool)
    if agent is not None:
        return agent_name(agent), "agent"
    name = getattr(tool, "name", None)
    return (name, "tool") if isinstance(name, str) and name else None


class ToolCalls(FunctionMiddleware):  # type: ignore[misc, unused-ignore]  # Any without the runtime
    """Function middleware: each call is a hop, and a refusal is the call's result text."""

    async def process(
        self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        found = hop_of(context.function) if guarding() else None
        if found is None:
            await call_next()
            return
        name, kind = found
        hop = delegate(name, kind=kind)
        try:
            ctx = await hop.astart()
        except DelegationRefused as err:
            context.result = refusal_text(err)  # the body never runs
            return
        token = otel_context.attach(otel_context.set_value(CALL, Call(name, hop), ctx))
        try:
            await call_next()
        except MiddlewareTermination:
            # A later middleware (or the tool) ended the function loop on purpose: the call is done.
            otel_context.detach(token)
            hop.finish()
            raise
        except Exception as exc:
            otel_context.detach(token)
            hop.finish(exc)
            refusal = refusal_behind(exc)
            if refusal is None:
                raise
            context.result = refusal_text(refusal)
            return
        except BaseException as exc:
            otel_context.detach(token)
            hop.finish(exc)
            raise
        otel_context.detach(token)
        hop.finish()


TOOL_CALLS: Final = ToolCalls()
"""The one instance every guarded run adds (one instance: Agent Framework caches a pipeline built of
the same middleware)."""
