"""Module calls as hops: ``Module.__call__`` and ``Module.acall``.

Every DSPy program is a ``dspy.Module`` and every call of one goes through ``__call__`` (or
``acall``). A call is a hop ``invoke_agent {name}``, where the name is, in this order:

* the module's ``name`` attribute, when it has one (``planner.name = "planner"``);
* its class name, for a module class of the app's own (``class Planner(dspy.Module)``);
* for DSPy's own modules (``dspy.ReAct``, ``dspy.ChainOfThought``, ...) with no name: the tool's name
  when the module runs as a tool's call, the class name when it runs outside any module; inside
  another module's run it is a step of that run, not a hop.

``dspy.Predict`` is never a hop: it is the model request itself (counted by :mod:`._usage`). A run
inside a tool call of its own name is that call's hop, not a second one. A refused run raises
:class:`~otel_guard.DelegationRefused` before its ``forward`` runs.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, a module with tools (``dspy.ReAct``) that can call an
agent on its call path gets the situational guidance at the start of its first text input: DSPy
makes the user turn of every model request from the inputs; the signature's instructions (the
system prompt) are never changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dspy.predict.predict import Predict
from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otel_guard.guard import current_chain, delegate
from otel_guard.instrumentation._base import acall_in_context, call_in_context
from otel_guard.instrumentation.dspy._scope import (
    in_module_run,
    inside_module_run,
    suppressed,
    tool_call_in_progress,
)
from otel_guard.prompt import guidance_for
from otel_guard.settings import current_settings

_FINISH: Final = "finish"
"""The tool ``dspy.ReAct`` adds for the end of a trajectory: it delegates nothing."""


def own_name(module: Any) -> str | None:
    """The name a module has of its own: its ``name`` attribute, or the class name of an app's class."""
    try:
        # DSPy's Module.__getattribute__ is Python code (it watches for direct forward() calls):
        # the generic lookup it ends in, without a Python frame, on every call of a module.
        name = object.__getattribute__(module, "name")
    except AttributeError:
        name = None
    if isinstance(name, str) and name:
        return name
    cls = type(module)
    return None if cls.__module__.startswith("dspy.") else cls.__name__


def hop_of(module: Any, ctx: Context) -> tuple[str, bool] | None:
    """(hop name, whether it joins the tool call in progress) of a call of ``module`` in ``ctx``;
    ``None``: no hop."""
    call = tool_call_in_progress(ctx)
    name = own_name(module)
    if name is None:
        if call is not None:
            return call, True
        if inside_module_run(ctx):
            return None
        name = type(module).__name__
    return name, name == call


def guard_call(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Module.__call__``: the call is one hop (or the tool call of its name it runs in); none while
    instrumentation is suppressed.

    Every ``Predict`` step of a run comes here too (it is a module): it is let through first, with
    no lookup at all, as is a call that is no hop after one lookup of the context.
    """
    if isinstance(instance, Predict):
        return wrapped(*args, **kwargs)
    current = otel_context.get_current()
    found = None if suppressed(current) else hop_of(instance, current)
    if found is None:
        return wrapped(*args, **kwargs)
    name, joined = found
    hop = None if joined else delegate(name)
    ctx = current if hop is None else hop.start()  # a refusal raises here
    return call_in_context(in_module_run(ctx), hop, lambda: wrapped(*args, **_guided(instance, kwargs)))


async def guard_acall(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Module.acall``: as :func:`guard_call`, awaited (a budget store with an asyncio API too)."""
    if isinstance(instance, Predict):
        return await wrapped(*args, **kwargs)
    current = otel_context.get_current()
    found = None if suppressed(current) else hop_of(instance, current)
    if found is None:
        return await wrapped(*args, **kwargs)
    name, joined = found
    hop = None if joined else delegate(name)
    ctx = current if hop is None else await hop.astart()  # a refusal raises here

    def run() -> Any:  # guided in the hop's context: the guidance reads its chain
        return wrapped(*args, **_guided(instance, kwargs))

    return await acall_in_context(in_module_run(ctx), hop, run)


def _guided(module: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's inputs, its first text input led by the situational guidance when it applies."""
    if not current_settings().situational_prompt:
        return kwargs
    tools = getattr(module, "tools", None)
    signature = getattr(module, "signature", None)
    if not isinstance(tools, dict) or signature is None:
        return kwargs
    field = next((k for k in signature.input_fields if isinstance(kwargs.get(k), str)), None)
    if field is None:
        return kwargs
    prefix = guidance_for(hop_name_in_force(module), tool_docs(tools))
    if prefix is None:
        return kwargs
    return {**kwargs, field: f"{prefix}\n\n{kwargs[field]}"}


def hop_name_in_force(module: Any) -> str:
    """The name of the hop the module's run is in (its own, or the tool call's it joined)."""
    chain = current_chain()
    return chain.hops[-1].agent if chain is not None else (own_name(module) or type(module).__name__)


def tool_docs(tools: dict[str, Any]) -> dict[str, str | None]:
    """Tool name -> description of every tool a module's model can call (ReAct's ``finish`` left out)."""
    docs: dict[str, str | None] = {}
    for name, tool in tools.items():
        if name != _FINISH:
            desc = getattr(tool, "desc", None)
            docs[name] = desc if isinstance(desc, str) else None
    return docs
