"""Tool calls as hops: ``Tool.__call__``, and the run's context carried into a CodeAgent's code.

Every call of a smolagents tool goes through ``Tool.__call__``: a ``ToolCallingAgent``'s (its
``execute_tool_call``), the calls a ``CodeAgent``'s code makes, and direct calls. A call is a hop
``execute_tool {tool.name}`` around the tool's ``forward``; a refused call raises
:class:`~otel_guard.DelegationRefused` and ``forward`` never runs; smolagents fails the step with it,
and the model reads the refusal's text (:mod:`._refusals`). The ``final_answer`` tool
(``FinalAnswerTool``) is no hop: nothing is delegated. A managed agent is not a tool: its call is
its run's hop (:mod:`._runs`).

The local executor runs a CodeAgent's code in a thread of its own (``local_python_executor.timeout``
submits it to a new ``ThreadPoolExecutor``), which starts with an empty context: the chain, and
OpenTelemetry's suppression flag, would not reach the tools the code calls. The executor's
``timeout`` decorator is wrapped so that the code runs in the OpenTelemetry context of the step that
runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from smolagents.default_tools import FinalAnswerTool

from otel_guard.guard import delegate
from otel_guard.instrumentation.smolagents._scope import in_tool_call


def guard_tool_call(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Tool.__call__``: the call is one hop ``execute_tool {name}`` (a call that is no hop, as every
    run's final answer, never asks whether instrumentation is suppressed)."""
    name = getattr(instance, "name", None)
    if (
        isinstance(instance, FinalAnswerTool)
        or not isinstance(name, str)
        or not name
        or not is_instrumentation_enabled()
    ):
        return wrapped(*args, **kwargs)
    # call_in_hop's steps written out: no closure around the call nor around the hop's start.
    hop = delegate(name, kind="tool")
    token = otel_context.attach(in_tool_call(name, hop.start()))  # a refusal raises here
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
    hop.finish()
    return result


def carry_context(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``local_python_executor.timeout(seconds)``: the decorator it returns runs the function in the
    OpenTelemetry context current where it was applied (the executor applies it, then calls at once).

    Not stepped aside under suppression: the suppression flag is in that context and must reach the
    code's thread as well.
    """
    decorator = wrapped(*args, **kwargs)

    def decorate(func: Callable[..., Any]) -> Any:
        ctx = otel_context.get_current()

        @functools.wraps(func)
        def in_context(*a: Any, **k: Any) -> Any:
            token = otel_context.attach(ctx)
            try:
                return func(*a, **k)
            finally:
                otel_context.detach(token)

        return decorator(in_context)

    return decorate
