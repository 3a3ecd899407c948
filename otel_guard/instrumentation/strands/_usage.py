"""A tree's model requests and tokens in Strands: ``InvokeModelStage`` middleware on every ``Agent``.

Strands sends every model request (each attempt, retries included) through the agent's
``InvokeModelStage`` middleware chain, whose result is the request's ``ModelStopReason`` with the
usage the provider reported. The first run of an agent that starts with ``max_model_requests`` or
``max_tokens`` on gives the agent this middleware; while a budget is on it checks and counts each
request against the run's tree before it is sent, and adds the response's
``inputTokens + outputTokens`` after.

A request the tree may not make is not sent. Strands has no limit *error*: its own per-invocation
caps (``limits=``) end the loop gracefully with a ``limit_*`` stop reason. A spent tree ends the run
the same way: the middleware answers for the model with a ``ModelStopReason`` whose stop reason is
``limit_turns`` (model requests) or ``limit_total_tokens`` (tokens) and whose message is the reason,
so the run ends with that ``stop_reason``, and code that handles Strands' own caps handles this one.
Every other run of the tree (a caller waiting on this one through a tool, say) ends the same way at
its next request. The refusal (or, in observe mode, the would-refuse) is an event on the span of the
run's hop.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import trace
from strands.middleware import InvokeModelStage
from strands.types.content import Message
from strands.types.event_loop import Metrics, StopReason, Usage
from strands.types.events import ModelStopReason

from otel_guard.instrumentation.strands._scope import RUN, Run, guarding
from otel_guard.usage import aafter_model_request, abefore_model_request, model_requests_counted

Next = Callable[[Any], AsyncGenerator[Any, None]]

_TOKENS_SPENT: Final = "(max_tokens "
"""How a refusal of :mod:`otel_guard.usage` names the tokens budget (else it is model requests)."""

_counted: weakref.WeakSet[Any] = weakref.WeakSet()
"""The agents whose model requests the middleware counts."""


def count_requests_of(agent: Any) -> None:
    """Add the middleware to ``agent``, once: the first time one of its runs starts while a model
    budget is on. An agent that never runs with one never pays for the middleware's layer."""
    if agent not in _counted:
        _counted.add(agent)
        agent.add_middleware(InvokeModelStage, count_model_request)


async def count_model_request(context: Any, next_fn: Next) -> AsyncGenerator[Any, None]:
    """``InvokeModelStage`` Wrap middleware: the request checked and counted against its tree."""
    if not (guarding() and model_requests_counted()):
        async for event in next_fn(context):
            yield event
        return
    refused = await _request_made()
    if refused is not None:
        yield _limit_reached(refused)
        return
    async for event in next_fn(context):
        if isinstance(event, ModelStopReason):
            usage = event.usage
            await aafter_model_request(int(usage.get("inputTokens", 0)) + int(usage.get("outputTokens", 0)))
        yield event


async def _request_made() -> str | None:
    """Count the request; the refusal message when the tree may not make it.

    The refusal's span event goes on the span of the run's hop (Strands' own cycle span is current
    here), where the hop's decision is.
    """
    run = otel_context.get_value(RUN)
    if not isinstance(run, Run) or not run.hop.opened:
        return await abefore_model_request()
    token = otel_context.attach(trace.set_span_in_context(run.hop.span))
    try:
        return await abefore_model_request()
    finally:
        otel_context.detach(token)


def _limit_reached(refused: str) -> Any:
    """The model's answer for a request the tree may not make: the run stops at a ``limit_*``."""
    stop_reason: StopReason = "limit_total_tokens" if _TOKENS_SPENT in refused else "limit_turns"
    message: Message = {"role": "assistant", "content": [{"text": refused}]}
    usage: Usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
    metrics: Metrics = {"latencyMs": 0}
    return ModelStopReason(stop_reason=stop_reason, message=message, usage=usage, metrics=metrics)
