"""Tool calls as hops: ``Tool.__call__`` and ``Tool.acall``, and what a refusal gives the model.

``dspy.ReAct`` calls the tool its model chose through ``Tool.__call__`` (``acall`` in ``aforward``),
and so does code that calls a ``dspy.Tool``. A call is a hop: into the agent, ``invoke_agent
{name}``, when the tool runs a module (``dspy.Tool(budget_module)``: a module used as another
module's tool, whose run joins the call), else ``execute_tool {tool.name}``. ReAct's ``finish`` tool
is no hop: nothing is delegated.

What a refusal looks like: ReAct hands a tool's exception to its model as the step's observation,
``Execution error in {tool}: {traceback}`` ending with the exception's text. A refused call raises
:class:`ToolCallRefused`, a :class:`~otel_guard.DelegationRefused` whose text is
:func:`~otel_guard.instrumentation._base.refusal_text` (reason, path, do not retry), before the
tool's body runs; a refusal raised inside the tool (a module it runs, refused) is raised again as
one, so the model reads the same text either way and answers with what it has.
"""

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import Any, Final, NoReturn

from dspy.primitives.module import Module
from opentelemetry import context as otel_context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import refusal_behind, refusal_text
from otel_guard.instrumentation.dspy._modules import own_name
from otel_guard.instrumentation.dspy._scope import in_tool_call, suppressed

_REACT: Final = "dspy.predict.react"
"""Where ReAct's own ``finish`` tool is defined."""


class ToolCallRefused(DelegationRefused):
    """A tool call refused by the guard, as its runtime's tool error: the text tells the model why,
    and not to call again. ``reason``, ``code``, ``hop`` and ``chain`` are the refusal's."""


def _hop(tool: Any) -> tuple[Delegation, str] | None:
    """The hop of a call of ``tool`` and the name its body runs under; ``None``: no hop (ReAct's
    ``finish``, or instrumentation suppressed)."""
    name = getattr(tool, "name", None)
    func = getattr(tool, "func", None)
    if not isinstance(name, str) or not name or (type(func) is FunctionType and func.__module__ == _REACT):
        return None
    if suppressed(otel_context.get_current()):
        return None
    if isinstance(func, Module):
        agent = own_name(func) or name
        return delegate(agent), agent
    return delegate(name, kind="tool"), name


def _refused(err: DelegationRefused) -> NoReturn:
    """Raise ``err`` as the tool error the model reads (once: a refusal raised as one stays as it is)."""
    if isinstance(err, ToolCallRefused):
        raise err
    raise ToolCallRefused(err.reason, refusal_text(err), err.hop, err.chain, remote=err.remote) from None


def guard_tool_call(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Tool.__call__``: the call is one hop."""
    found = _hop(instance)
    if found is None:
        return wrapped(*args, **kwargs)
    hop, name = found
    try:
        ctx = hop.start()
    except DelegationRefused as err:
        _refused(err)
    token = otel_context.attach(in_tool_call(name, ctx))
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        refusal = refusal_behind(exc)
        if refusal is not None:
            _refused(refusal)
        raise
    otel_context.detach(token)
    hop.finish()
    return result


async def guard_tool_acall(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Tool.acall``: as :func:`guard_tool_call`, awaited."""
    found = _hop(instance)
    if found is None:
        return await wrapped(*args, **kwargs)
    hop, name = found
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        _refused(err)
    token = otel_context.attach(in_tool_call(name, ctx))
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        refusal = refusal_behind(exc)
        if refusal is not None:
            _refused(refusal)
        raise
    otel_context.detach(token)
    hop.finish()
    return result
