"""Agent runs as hops: ``Agent.run`` and ``Agent.run_async``, however the Agent is run.

A run is a hop ``invoke_agent {name}`` around the whole run, so its model requests and tool calls
happen inside it. A Haystack ``Agent`` has no name of its own; its hop's name is, first:

* the name of the tool call it runs in, when that tool wraps it (``AgentTool(agent, name="budget")``,
  a ``ComponentTool`` around it) or is named like it: that call's hop, one call and one hop;
* the name it was added to a pipeline under (``pipeline.add_component("planner", agent)``); a
  pipeline component named like the tool call it runs in joins that call too;
* with neither, inside a tool call (a function tool whose body runs an Agent): that call's hop;
* else its class name, ``Agent`` (name a top-level Agent by running it in a pipeline).

A refused run raises :class:`~otel_guard.DelegationRefused` before the Agent does anything; inside a
tool the tool fails with the refusal's text (:mod:`._tools`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context

from otel_guard.guard import delegate
from otel_guard.instrumentation._base import acall_in_context, call_in_context, unless_suppressed
from otel_guard.instrumentation.haystack._scope import call_in_progress, with_values


def pipeline_name(agent: Any) -> str | None:
    """The name ``agent`` was added to a pipeline under, if it was."""
    pipeline = getattr(agent, "__haystack_added_to_pipeline__", None)
    if pipeline is None:
        return None
    try:
        name = pipeline.get_component_name(agent)
    except Exception:  # a pipeline that no longer holds it
        return None
    return name if isinstance(name, str) and name else None


def _hop_for(agent: Any) -> tuple[str, bool]:
    """(the run's hop name, whether it joins the tool call in progress)."""
    call = call_in_progress()
    if call is not None and call.agent is agent:
        return call.name, True
    name = pipeline_name(agent)
    if name is None:
        # No name of its own: inside a tool call, the call names it (a function tool that runs an
        # Agent is that agent's call); outside any, its class name.
        return (call.name, True) if call is not None else (type(agent).__name__, False)
    return name, call is not None and call.name == name


@unless_suppressed
def guard_run(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.run``: the run is one hop (or the tool call that runs it)."""
    name, joins = _hop_for(instance)
    hop = None if joins else delegate(name)
    ctx = otel_context.get_current() if hop is None else hop.start()  # a refusal raises here
    return call_in_context(with_values(ctx, call=None, run=name), hop, lambda: wrapped(*args, **kwargs))


@unless_suppressed
async def guard_run_async(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.run_async``: as :func:`guard_run`."""
    name, joins = _hop_for(instance)
    hop = None if joins else delegate(name)
    ctx = otel_context.get_current() if hop is None else await hop.astart()  # a refusal raises here
    ctx = with_values(ctx, call=None, run=name)
    return await acall_in_context(ctx, hop, lambda: wrapped(*args, **kwargs))
