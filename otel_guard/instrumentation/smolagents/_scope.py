"""What a smolagents tool call in progress leaves in the context, and whether the guard is on.

A tool call's hop puts the tool's name in the OpenTelemetry context it runs the tool in, so an
agent run of the same name inside the tool's body (a tool ``budget`` that runs agent ``budget``) is
the same call, not a second hop. Every agent run clears it: what runs inside a run is the run's own.

The step callbacks the guard adds to an agent cannot be taken off again (smolagents' callback
registry has no way to remove one), so they ask :func:`guarding` and do nothing once
``uninstrument()`` has switched the guard off.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

CALL: Final = otel_context.create_key("otel_guard_smolagents_tool_call")
"""Context key: the name of the tool whose body runs here (``None`` once an agent run starts)."""

_on = False


def switch_on(on: bool) -> None:
    global _on
    _on = on


def guarding() -> bool:
    """Whether the guard is on and instrumentation is not suppressed here."""
    return _on and is_instrumentation_enabled()


def in_tool_call(name: str | None, ctx: Context) -> Context:
    """``ctx`` with ``name`` as the tool call in progress (``None``: none)."""
    return Context({**ctx, CALL: name})  # as set_value makes it, without the call


def tool_call_in_progress() -> str | None:
    """The name of the tool whose body runs in the current context, if any."""
    name = otel_context.get_value(CALL)
    return name if isinstance(name, str) else None
