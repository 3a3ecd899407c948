"""Tool calls as hops: ``FunctionTool.invoke``, wrapped, within a guarded agent run.

Agent Framework runs every function call the model asks for through the run's function middleware
(when there is any), whose last link is the tool's ``invoke`` (which opens Agent Framework's own
``execute_tool`` span). The guard wraps ``invoke`` itself rather than adding middleware of its own:
a run with no function middleware then calls the tool directly, and the pipeline Agent Framework
builds for any function middleware at all cost more than the hop (132 k instructions a run,
``bench/runtime_overhead.py``). So a call the app's middleware (the agent's, the run's, a context
provider's) answers or stops is no hop: nothing was delegated. An ``invoke`` outside a guarded run
(a test calling a tool, an agent built before ``instrument()``) is no hop either.

Which hop a call is (:func:`hop_of`):

* an agent offered as a tool (``agent.as_tool()``) is a hop into that agent, ``invoke_agent
  {agent name}``, whatever the tool is called, and the agent's run inside it joins that hop;
* any other tool is ``execute_tool {tool name}``; an agent run of the same name inside it joins it.

What a refusal looks like. Agent Framework hides a failed tool's exception from the model (it sends
``"Error: Function failed."`` unless ``include_detailed_errors`` is on), so the guard never lets a
refusal fail the call: :func:`refusal_text` is the call's result instead. A refused call's body never
runs; a call whose body raised a refusal (a tool whose agent run was refused) gets the same text as
its result. The model reads it and the run goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

from agent_framework import SKIP_PARSING, Content, MiddlewareTermination
from opentelemetry import context as otel_context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.agent_framework._handoffs import is_handoff
from otel_guard.instrumentation.agent_framework._scope import CALL, RUN, Call, agent_name, guarding

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


async def guard_invoke(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``FunctionTool.invoke``: within a guarded run (:data:`RUN` set), a call is a hop."""
    found = hop_of(instance) if guarding() and otel_context.get_value(RUN) is not None else None
    if found is None:
        return await wrapped(*args, **kwargs)
    name, kind = found
    hop = delegate(name, kind=kind)
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        return _result(refusal_text(err), instance, kwargs)  # the body never runs
    token = otel_context.attach(otel_context.set_value(CALL, Call(name, hop), ctx))
    try:
        result = await wrapped(*args, **kwargs)
    except MiddlewareTermination:
        # The tool ended the function loop on purpose (Agent Framework's way): the call is done.
        otel_context.detach(token)
        hop.finish()
        raise
    except Exception as exc:
        otel_context.detach(token)
        hop.finish(exc)
        refusal = refusal_behind(exc)
        if refusal is None:
            raise
        return _result(refusal_text(refusal), instance, kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
    hop.finish()
    return result


def _result(text: str, tool: Any, kwargs: dict[str, Any]) -> Any:
    """A refusal as ``invoke`` returns a result: Content items, or the text itself where the tool's
    results are left unparsed (``skip_parsing``, or a tool made with ``SKIP_PARSING``)."""
    if kwargs.get("skip_parsing") or getattr(tool, "result_parser", None) is SKIP_PARSING:
        return text
    return [Content.from_text(text)]
