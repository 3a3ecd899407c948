"""A tree's model requests and tokens in Strands: ``InvokeModelStage`` middleware on every ``Agent``.

Strands sends every model request (each attempt, retries included) through the agent's
``InvokeModelStage`` middleware chain, whose result is the request's ``ModelStopReason`` with the
usage the provider reported. The first run of an agent that starts with ``max_model_requests`` or
``max_tokens`` on gives the agent this middleware; while a budget is on it checks and counts each
request against the run's tree before it is sent, and adds the response's
``inputTokens + outputTokens`` after. With ``max_cost`` on it is priced as the model's
``get_config()["model_id"]``, its cached input tokens (``cacheReadInputTokens``,
``cacheWriteInputTokens``) at the cache prices: Strands' providers differ on whether ``inputTokens``
holds them (OpenAI's do, Anthropic's and Bedrock's do not), which ``totalTokens`` tells.

A request the tree may not make is not sent. Strands has no limit *error*: its own per-invocation
caps (``limits=``) end the loop gracefully with a ``limit_*`` stop reason. A spent tree ends the run
the same way: the middleware answers for the model with a ``ModelStopReason`` whose stop reason is
``limit_turns`` (model requests) or ``limit_total_tokens`` (tokens, money) and whose message is the reason,
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
from otel_guard.usage import ModelUsage, aafter_model_request, abefore_model_request, model_requests_counted

Next = Callable[[Any], AsyncGenerator[Any, None]]

_SPENDING: Final = ("(max_tokens ", "(max_cost ", "(budget_unpriced ")
"""How a refusal of :mod:`otel_guard.usage` names the tokens or the money budget (else it is model
requests): Strands has no money cap of its own, so a spent ``max_cost`` stops as its token cap does."""

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
            await aafter_model_request(model_usage(event.usage, getattr(context, "model", None)))
        yield event


def model_usage(usage: Any, model: Any) -> ModelUsage:
    """What a response used, priced as ``model``'s ``model_id``; ``max_tokens`` counts
    ``inputTokens + outputTokens`` as before."""
    reported_input = int(usage.get("inputTokens", 0) or 0)
    output = int(usage.get("outputTokens", 0) or 0)
    read = int(usage.get("cacheReadInputTokens", 0) or 0)
    written = int(usage.get("cacheWriteInputTokens", 0) or 0)
    total = usage.get("totalTokens")
    cached_apart = (read or written) and total == reported_input + output + read + written
    return ModelUsage(
        _model_id(model),
        reported_input + read + written if cached_apart else reported_input,
        output,
        read,
        written,
        counted_tokens=reported_input + output,
    )


def _model_id(model: Any) -> str | None:
    try:
        config = model.get_config()
    except Exception:  # a model without a config of that shape: priced by no name
        return None
    name = config.get("model_id") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name else None


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
    spent = any(budget in refused for budget in _SPENDING)
    stop_reason: StopReason = "limit_total_tokens" if spent else "limit_turns"
    message: Message = {"role": "assistant", "content": [{"text": refused}]}
    usage: Usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
    metrics: Metrics = {"latencyMs": 0}
    return ModelStopReason(stop_reason=stop_reason, message=message, usage=usage, metrics=metrics)
