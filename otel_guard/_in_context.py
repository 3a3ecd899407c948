"""Run a call in a given OpenTelemetry context: the work a thread or a pool runs for its submitter.

Apart from :mod:`otel_guard._threads` and :mod:`otel_guard._pools` so that both use it and neither
imports the other for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import context
from opentelemetry.context import Context


def call_in(ctx: Context, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` in ``ctx`` (the work handed to a thread pool, wrapped)."""
    token = context.attach(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        context.detach(token)
