"""A tree's model requests, tokens and cost in Agno: every request a ``Model`` makes, and its ``Metrics``.

Every model request of an Agno run (an agent's, a team leader's, each retry's attempt aside) goes
through one of ``Model``'s four request methods (``_invoke_with_retry``, ``_ainvoke_with_retry`` and
their streaming forms), whatever the provider class. While ``max_model_requests``, ``max_tokens`` or
``max_cost`` is on, each request is checked and counted against its tree before it is sent; the tokens
of the response's ``response_usage`` (Agno's ``MessageMetrics``: ``input_tokens + output_tokens``) are
added after (a stream's, summed over its chunks). With ``max_cost`` on the response is priced by the
``Model``'s ``id`` (its ``provider`` helping genai-prices) and those metrics, cache tokens included;
``MessageMetrics.cost`` comes first: Agno sets it only from the ``usage.cost`` an OpenAI-compatible
provider charged and reported (OpenRouter's). Agno's Anthropic models report ``input_tokens`` without
the cached ones (Anthropic's own count); those are added for the price, not for ``max_tokens``.

A request the tree may not make is not sent: it raises :class:`TreeBudgetExceeded`, an
``AgnoError`` that Agno's retries leave alone, so the run ends with it (``Agent.run`` answers a
``RunOutput`` with ``status`` ``error`` and the refusal as its content, as it does for any failed
model; ``Agent.arun`` alike). Inside a tool call the calling model reads the same text as the tool's
error result, and its own next request is refused the same way, so the whole tree ends. The refusal
(in observe mode, the would-refuse) is an event on the span of the run's hop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from decimal import Decimal
from typing import Any

from agno.exceptions import AgnoError

from otel_guard._pricing import reported_cost
from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.usage import (
    ModelUsage,
    aafter_model_request,
    abefore_model_request,
    after_model_request,
    before_model_request,
    model_requests_counted,
)


class TreeBudgetExceeded(AgnoError):  # type: ignore[misc, unused-ignore]  # Any without agno
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens`` or
    ``max_cost``."""


class _Used:
    """What one request's responses (a stream's chunks, summed) reported in their ``response_usage``."""

    __slots__ = ("cache_read", "cache_write", "cost", "input", "output")

    def __init__(self) -> None:
        self.input = self.output = self.cache_read = self.cache_write = 0
        self.cost: Decimal | None = None

    def add(self, response: Any) -> None:
        usage = getattr(response, "response_usage", None)
        if usage is None:
            return
        self.input += int(getattr(usage, "input_tokens", 0) or 0)
        self.output += int(getattr(usage, "output_tokens", 0) or 0)
        self.cache_read += int(getattr(usage, "cache_read_tokens", 0) or 0)
        self.cache_write += int(getattr(usage, "cache_write_tokens", 0) or 0)
        cost = reported_cost(getattr(usage, "cost", None))
        if cost is not None:
            self.cost = cost if self.cost is None else self.cost + cost

    def usage(self, model: Any) -> ModelUsage:
        """What the request used, as ``model`` (the ``Model`` that made it) names and counts it."""
        name = getattr(model, "id", None)
        provider = getattr(model, "provider", None)
        priced_input = self.input
        if _leaves_cache_out(model):
            priced_input += self.cache_read + self.cache_write
        return ModelUsage(
            name if isinstance(name, str) and name else None,
            priced_input,
            self.output,
            self.cache_read,
            self.cache_write,
            self.cost,
            provider=provider.lower() if isinstance(provider, str) and provider else None,
            counted_tokens=self.input + self.output,
        )


def _leaves_cache_out(model: Any) -> bool:
    """Whether ``model`` is one of Agno's Anthropic models, whose ``input_tokens`` leave out the
    prompt-cache tokens."""
    return any(cls.__module__.startswith("agno.models.anthropic") for cls in type(model).__mro__)


def _used(model: Any, response: Any) -> ModelUsage:
    used = _Used()
    used.add(response)
    return used.usage(model)


@unless_suppressed
def count_request(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Model._invoke_with_retry``: the request counted, then its tokens."""
    if not model_requests_counted():
        return wrapped(*args, **kwargs)
    refused = before_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    response = wrapped(*args, **kwargs)
    after_model_request(_used(instance, response))
    return response


@unless_suppressed
async def count_arequest(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Model._ainvoke_with_retry``: as :func:`count_request`, awaited."""
    if not model_requests_counted():
        return await wrapped(*args, **kwargs)
    refused = await abefore_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    response = await wrapped(*args, **kwargs)
    await aafter_model_request(_used(instance, response))
    return response


@unless_suppressed
def count_stream(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Model._invoke_stream_with_retry``: the request counted when its stream starts."""
    if not model_requests_counted():
        return wrapped(*args, **kwargs)
    return _counted_stream(instance, wrapped(*args, **kwargs))


def _counted_stream(model: Any, chunks: Iterator[Any]) -> Iterator[Any]:
    refused = before_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    used = _Used()
    try:
        for chunk in chunks:
            used.add(chunk)
            yield chunk
    finally:
        after_model_request(used.usage(model))


@unless_suppressed
def count_astream(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Model._ainvoke_stream_with_retry``: as :func:`count_stream`, async."""
    if not model_requests_counted():
        return wrapped(*args, **kwargs)
    return _acounted_stream(instance, wrapped(*args, **kwargs))


async def _acounted_stream(model: Any, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    refused = await abefore_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    used = _Used()
    try:
        async for chunk in chunks:
            used.add(chunk)
            yield chunk
    finally:
        await aafter_model_request(used.usage(model))
