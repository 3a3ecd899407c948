"""A tree's model requests and tokens in Agent Framework: a ``ChatMiddleware`` on every guarded run.

Agent Framework's function-calling loop sends each model request of a run (each iteration, and the
final one its own limits ask for) through the run's chat middleware. While ``max_model_requests`` or
``max_tokens`` is on, the guard's run middleware adds :class:`ModelRequests` to each run's chat
middleware (:mod:`._runs`); it checks and counts the request against the run's tree before it is
sent, and adds the response's ``input_token_count + output_token_count`` after (for a streamed
response, once the response is complete). With ``max_cost`` on it is priced as the model the
response names (``ChatResponse.model``), else the request's ``model`` option, else the chat client's
``model``; the cache counts of its ``usage_details`` at the cache prices, and a cost an
OpenAI-compatible provider reported in its raw response (OpenRouter's ``usage.cost``) first.

A request the tree may not make is not sent. Agent Framework ends a run that meets its own limits
(``max_iterations``, ``max_function_calls``) with a last answer rather than an error; a spent tree
ends the run the same way: the middleware answers for the model with an assistant message that is
the reason, finish reason ``"length"`` and no tool calls, so the function loop stops there and the
run's response is that message. Every other run of the tree (a caller waiting on this one through a
tool) ends the same way at its next request. The refusal (or, in observe mode, the would-refuse) is
an event on the span of the run's hop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from agent_framework import ChatContext, ChatMiddleware, ChatResponse, ChatResponseUpdate, Message
from agent_framework import ResponseStream as Stream
from opentelemetry import context as otel_context
from opentelemetry import trace

from otel_guard._pricing import charged_in
from otel_guard.instrumentation.agent_framework._scope import RUN, Run, guarding
from otel_guard.usage import ModelUsage, aafter_model_request, abefore_model_request, model_requests_counted


class ModelRequests(ChatMiddleware):  # type: ignore[misc, unused-ignore]  # Any without the runtime
    """Chat middleware: each model request checked and counted against its tree."""

    async def process(self, context: ChatContext, call_next: Callable[[], Awaitable[None]]) -> None:
        if not (guarding() and model_requests_counted()):
            await call_next()
            return
        refused = await _request_made()
        if refused is not None:
            context.result = _limit_reached(refused, streamed=context.stream)
            return
        await call_next()
        result = context.result
        model = _requested_model(context)
        if isinstance(result, ChatResponse):
            await aafter_model_request(model_usage(result, model))
        elif isinstance(result, Stream):

            async def count(response: ChatResponse[Any]) -> None:
                """The streamed response's result hook: its usage counted (the response left as it is)."""
                await aafter_model_request(model_usage(response, model))

            context.stream_result_transforms.append(count)


MODEL_REQUESTS: Final = ModelRequests()
"""The one instance every guarded run adds while a model budget is on."""


def model_usage(response: ChatResponse[Any], requested: str | None) -> ModelUsage:
    """What a response used: its ``usage_details``, priced as the model it names (else ``requested``)."""
    usage = response.usage_details or {}
    named = getattr(response, "model", None)
    return ModelUsage(
        named if isinstance(named, str) and named else requested,
        int(usage.get("input_token_count") or 0),
        int(usage.get("output_token_count") or 0),
        int(usage.get("cache_read_input_token_count") or 0),
        int(usage.get("cache_creation_input_token_count") or 0),
        charged_in(getattr(response, "raw_representation", None)),
    )


def _requested_model(context: ChatContext) -> str | None:
    """The model a request asks for: its ``model`` option, else the chat client's ``model``."""
    options = context.options or {}
    for name in (options.get("model"), getattr(context.client, "model", None)):
        if isinstance(name, str) and name:
            return name
    return None


async def _request_made() -> str | None:
    """Count the request; the refusal message when the tree may not make it.

    The refusal's span event goes on the span of the run's hop (Agent Framework's own span is current
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


def _limit_reached(refused: str, *, streamed: bool) -> ChatResponse[Any] | Stream[ChatResponseUpdate, Any]:
    """The model's answer for a request the tree may not make: a last message, no tool calls."""
    message = Message(role="assistant", contents=[refused])
    if not streamed:
        return ChatResponse(messages=[message], finish_reason="length")

    async def updates() -> AsyncIterator[ChatResponseUpdate]:
        yield ChatResponseUpdate(role="assistant", contents=message.contents, finish_reason="length")

    return Stream(updates(), finalizer=ChatResponse.from_updates)
