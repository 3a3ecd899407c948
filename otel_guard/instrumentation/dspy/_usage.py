"""A tree's model requests, tokens and cost in DSPy: ``BaseLM.__call__`` / ``acall``, and its usage.

Every model request a DSPy program makes goes through its LM's ``__call__`` (or ``acall``): each
``Predict`` step, ``ReAct``'s and ``ChainOfThought``'s included, whatever the LM class (``dspy.LM``,
``DummyLM``, a ``BaseLM`` subclass). While ``max_model_requests``, ``max_tokens`` or ``max_cost`` is on, each
request is checked and counted against its tree before it is sent. Its tokens (``prompt_tokens +
completion_tokens`` of the usage DSPy records, the same figures as ``dspy.track_usage``) are added
when DSPy finalizes the call (``dspy.clients.execution.finalize``); a response served from DSPy's
cache used no tokens and adds none. With ``max_cost`` on, the response is priced by the model that
answered (the call's ``response_model``, else the LM's ``model``; a ``provider/`` prefix of the LM's
model helps genai-prices) and its usage, cached prompt tokens included; a ``cost`` in the provider's
own ``usage`` (OpenRouter's charge) comes first. The call's ``cost`` (LiteLLM's ``response_cost``, the
``cost`` of DSPy's history) is not read: it is LiteLLM's estimate from its price table, which comes
after the user's prices file.

A request the tree may not make is not sent: the call raises :class:`TreeBudgetExceeded`, an
``LMError`` (DSPy's error for a language model that could not answer, which no DSPy module retries
or turns into an observation), so the program's run ends with it. In a module used as a tool, the
calling ``ReAct`` reads it as the tool's error, and its own next request is refused the same way,
so the whole tree ends. The refusal (in observe mode, the would-refuse) is an event on the span of
the hop the request is made in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dspy.utils.exceptions import LMError

from otel_guard._pricing import reported_cost
from otel_guard.usage import (
    ModelUsage,
    abefore_model_request,
    after_model_request,
    before_model_request,
    model_requests_counted,
)


class TreeBudgetExceeded(LMError):  # type: ignore[misc, unused-ignore]  # Any without dspy
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens`` or
    ``max_cost``."""

    default_code = "a2a_delegation_budget"


def count_request(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``BaseLM.__call__``: the request counted (and refused when the tree may not make it).

    :func:`model_requests_counted` is the wrapper's first check: whether a model budget is on, then
    whether instrumentation is suppressed; with no budget on, a request costs the guard one look at
    the settings."""
    if model_requests_counted():
        refused = before_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
    return wrapped(*args, **kwargs)


async def count_arequest(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``BaseLM.acall``: as :func:`count_request`, awaited."""
    if model_requests_counted():
        refused = await abefore_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
    return await wrapped(*args, **kwargs)


def count_tokens(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``execution.finalize(lm, call, result)``: the response's tokens and cost added to the tree."""
    if model_requests_counted():
        lm = args[0] if args else kwargs.get("lm")
        result = args[2] if len(args) > 2 else kwargs.get("result")
        if result is not None and not getattr(result, "cache_hit", False):
            after_model_request(model_usage(lm, result))
    return wrapped(*args, **kwargs)


def model_usage(lm: Any, result: Any) -> ModelUsage:
    """What a DSPy ``CallResult`` used: the model that answered, its tokens, a cost its provider
    reported in its usage."""
    usage = getattr(result, "usage", None)
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    configured = getattr(lm, "model", None)
    configured = configured if isinstance(configured, str) else None
    answered = getattr(result, "response_model", None)
    provider = configured.split("/", 1)[0] if configured and "/" in configured else None
    return ModelUsage(
        answered if isinstance(answered, str) and answered else configured,
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        int(details.get("cache_creation_tokens") or 0),
        reported_cost(usage.get("cost")),
        provider=provider,
    )
