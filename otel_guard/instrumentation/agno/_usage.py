"""A tree's model requests and tokens in Agno: every request a ``Model`` makes, and its ``Metrics``.

Every model request of an Agno run (an agent's, a team leader's, each retry's attempt aside) goes
through one of ``Model``'s four request methods (``_invoke_with_retry``, ``_ainvoke_with_retry`` and
their streaming forms), whatever the provider class. While ``max_model_requests`` or ``max_tokens``
is on, each request is checked and counted against its tree before it is sent; the tokens of the
response's ``response_usage`` (Agno's ``MessageMetrics``: ``input_tokens + output_tokens``) are added
after (a stream's, summed over its chunks).

A request the tree may not make is not sent: it raises :class:`TreeBudgetExceeded`, an
``AgnoError`` that Agno's retries leave alone, so the run ends with it (``Agent.run`` answers a
``RunOutput`` with ``status`` ``error`` and the refusal as its content, as it does for any failed
model; ``Agent.arun`` alike). Inside a tool call the calling model reads the same text as the tool's
error result, and its own next request is refused the same way, so the whole tree ends. The refusal
(in observe mode, the would-refuse) is an event on the span of the run's hop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from agno.exceptions import AgnoError

from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.usage import (
    aafter_model_request,
    abefore_model_request,
    after_model_request,
    before_model_request,
    model_requests_counted,
)


class TreeBudgetExceeded(AgnoError):  # type: ignore[misc, unused-ignore]  # Any without agno
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens``."""


def _tokens(response: Any) -> int:
    usage = getattr(response, "response_usage", None)
    if usage is None:
        return 0
    return int(getattr(usage, "input_tokens", 0) or 0) + int(getattr(usage, "output_tokens", 0) or 0)


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
    after_model_request(_tokens(response))
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
    await aafter_model_request(_tokens(response))
    return response


@unless_suppressed
def count_stream(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Model._invoke_stream_with_retry``: the request counted when its stream starts."""
    if not model_requests_counted():
        return wrapped(*args, **kwargs)
    return _counted_stream(wrapped(*args, **kwargs))


def _counted_stream(chunks: Iterator[Any]) -> Iterator[Any]:
    refused = before_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    tokens = 0
    try:
        for chunk in chunks:
            tokens += _tokens(chunk)
            yield chunk
    finally:
        after_model_request(tokens)


@unless_suppressed
def count_astream(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Model._ainvoke_stream_with_retry``: as :func:`count_stream`, async."""
    if not model_requests_counted():
        return wrapped(*args, **kwargs)
    return _acounted_stream(wrapped(*args, **kwargs))


async def _acounted_stream(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    refused = await abefore_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    tokens = 0
    try:
        async for chunk in chunks:
            tokens += _tokens(chunk)
            yield chunk
    finally:
        await aafter_model_request(tokens)
