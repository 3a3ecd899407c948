"""A tree's model requests and tokens in the OpenAI Agents SDK: around each call of the model.

The SDK asks its model through ``get_response_with_retry(get_response=...)`` and
``stream_response_with_retry(get_stream=...)`` (each attempt calls the callable once). The
instrumentor wraps the callable: before each attempt the tree's budgets are checked and the request
counted; after it the response's ``usage`` (input + output tokens; a stream's from its
``response.completed`` event) is added to the tree. With ``max_cost`` on it is priced by the model's
name (a stream's ``response.model``, else the ``model`` attribute of the SDK's model object, as
``OpenAIResponsesModel``, ``OpenAIChatCompletionsModel`` and ``LitellmModel`` hold it), its cached
input tokens, and a cost the provider reported in its usage (``raw_usage["cost"]``, OpenRouter's
actual charge, kept when ``ModelSettings(preserve_raw_usage=True)``). A request the tree may not
make ends the run with :class:`TreeBudgetExceeded`, a ``MaxTurnsExceeded``: the error the SDK ends a
run with on its own limit, so code that handles that one handles this too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from agents.exceptions import MaxTurnsExceeded

from otel_guard._pricing import reported_cost
from otel_guard.usage import ModelUsage, aafter_model_request, abefore_model_request, model_requests_counted


class TreeBudgetExceeded(MaxTurnsExceeded):
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens`` or
    ``max_cost``."""


def model_usage(usage: Any, model: str | None, raw_usage: Any = None) -> ModelUsage:
    """What a response used: its ``usage`` (an SDK ``Usage`` or a Responses API usage), the model's
    name, and a cost the provider reported in its raw usage."""
    details = getattr(usage, "input_tokens_details", None)
    return ModelUsage(
        model,
        int(getattr(usage, "input_tokens", 0) or 0),
        int(getattr(usage, "output_tokens", 0) or 0),
        int(getattr(details, "cached_tokens", 0) or 0),
        int(getattr(details, "cache_write_tokens", 0) or 0),
        reported_cost(raw_usage.get("cost")) if isinstance(raw_usage, dict) else None,
    )


def _model_name(kwargs: dict[str, Any]) -> str | None:
    """The name of the model the SDK asks: the ``model`` of the object whose ``get_retry_advice`` it
    passes (every SDK model names its model so)."""
    model = getattr(kwargs.get("get_retry_advice"), "__self__", None)
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


def guard_get_response(
    wrapped: Callable[..., Awaitable[Any]], instance: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Awaitable[Any]:
    """``get_response_with_retry(*, get_response, ...)``: each attempt checked, its usage counted.

    Not a coroutine: the SDK's own coroutine is returned (with the counted callable, when counted)."""
    get_response = kwargs.get("get_response")
    if get_response is None or not model_requests_counted():
        return wrapped(*args, **kwargs)

    async def counted() -> Any:
        refused = await abefore_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
        response = await get_response()
        usage = getattr(response, "usage", None)
        await aafter_model_request(
            model_usage(usage, _model_name(kwargs), getattr(response, "raw_usage", None))
        )
        return response

    return wrapped(*args, **{**kwargs, "get_response": counted})


def guard_stream_response(
    wrapped: Callable[..., AsyncIterator[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> AsyncIterator[Any]:
    """``stream_response_with_retry(*, get_stream, ...)``: as :func:`guard_get_response`, streamed."""
    get_stream = kwargs.get("get_stream")
    if get_stream is None or not model_requests_counted():
        return wrapped(*args, **kwargs)

    async def counted() -> AsyncIterator[Any]:
        refused = await abefore_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
        async for event in get_stream():
            if getattr(event, "type", None) == "response.completed":
                response = getattr(event, "response", None)
                model = getattr(response, "model", None)
                name = model if isinstance(model, str) and model else _model_name(kwargs)
                await aafter_model_request(model_usage(getattr(response, "usage", None), name))
            yield event

    return wrapped(*args, **{**kwargs, "get_stream": counted})
