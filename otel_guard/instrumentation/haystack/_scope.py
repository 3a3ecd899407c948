"""What a Haystack tool call or Agent run in progress leaves in the OpenTelemetry context.

A tool call's hop puts a :class:`Call` in the context it runs the tool in, so that the Agent run
inside it (an ``AgentTool``'s agent, or an agent named like the tool) is that call, not a second
hop. Every Agent run puts its own name in the context (:data:`RUN`) and clears the call: what runs
inside a run is the run's own, and the steps the guard wraps (its hooks, its usage) read the name.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry.context import Context

CALL: Final = otel_context.create_key("otel_guard_haystack_tool_call")
RUN: Final = otel_context.create_key("otel_guard_haystack_run")


class Call(NamedTuple):
    """A tool call in progress: its hop's name, and the Agent it runs (``None``: not an Agent)."""

    name: str
    agent: Any


def call_in_progress() -> Call | None:
    call = otel_context.get_value(CALL)
    return call if isinstance(call, Call) else None


def run_in_progress() -> str | None:
    """The hop name of the Agent run the current code is part of, if any."""
    name = otel_context.get_value(RUN)
    return name if isinstance(name, str) else None


def with_values(ctx: Context, **values: Any) -> Context:
    """``ctx`` with :data:`CALL` (``call=``) and :data:`RUN` (``run=``) set, in one copy."""
    keys = {"call": CALL, "run": RUN}
    return Context({**ctx, **{keys[name]: value for name, value in values.items()}})
