"""Where a DSPy call stands: what the guard keeps in the OpenTelemetry context, and its switch.

A tool call's hop puts the tool's name in the context it runs the tool in (:data:`CALL`), so a module
run directly by the tool (``dspy.Tool(budget_module)``, or a tool function that calls a module) is that
call, not a second hop. A module run that is a hop marks its context as inside a module
(:data:`IN_MODULE`) and clears the call: what runs inside a run is the run's own, and DSPy's own
building blocks called there (``ChainOfThought``, ``Predict``) are steps of the run, not agents.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import context as otel_context
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, Context
from opentelemetry.instrumentation.utils import _SUPPRESS_INSTRUMENTATION_KEY_PLAIN

CALL: Final = otel_context.create_key("otel_guard_dspy_tool_call")
"""Context key: the name of the tool whose body runs here (``None`` once a module run starts)."""

IN_MODULE: Final = otel_context.create_key("otel_guard_dspy_in_module")
"""Context key: ``True`` inside a guarded module run (and no tool call since)."""


def suppressed(ctx: Context) -> bool:
    """Whether instrumentation is suppressed in ``ctx``: ``not is_instrumentation_enabled()``, read
    from a context the wrapper has looked up once (OpenTelemetry's helper looks it up once per key)."""
    return bool(ctx.get(_SUPPRESS_INSTRUMENTATION_KEY) or ctx.get(_SUPPRESS_INSTRUMENTATION_KEY_PLAIN))


def in_tool_call(name: str, ctx: Context) -> Context:
    """``ctx`` with ``name`` as the tool call in progress, outside any module run."""
    return Context({**ctx, CALL: name, IN_MODULE: False})


def in_module_run(ctx: Context) -> Context:
    """``ctx`` inside a module run: no tool call of its caller's in progress."""
    return Context({**ctx, CALL: None, IN_MODULE: True})


def tool_call_in_progress(ctx: Context) -> str | None:
    """The name of the tool whose body runs in ``ctx``, if any."""
    name = ctx.get(CALL)
    return name if isinstance(name, str) else None


def inside_module_run(ctx: Context) -> bool:
    """Whether ``ctx`` is inside a guarded module run, with no tool call since."""
    return ctx.get(IN_MODULE) is True
