"""A tree's model requests and tokens in LangChain / LangGraph: at LangChain's model callbacks.

Every model call of LangChain (a chat model's or an LLM's ``invoke``, ``stream``, ``batch``, sync or
async) starts its run through ``CallbackManager.on_chat_model_start`` / ``on_llm_start`` and ends it
through ``on_llm_end`` of the run's manager. The instrumentor checks the tree's budgets and counts the
request *before* the callbacks run (so no tracer opens a span for a request that is not made), and
adds the response's tokens at ``on_llm_end``: the ``usage_metadata`` of each generation's message
(input + output tokens), or the ``token_usage`` an LLM reports in its ``llm_output``.

A request the tree may not make raises :class:`TreeBudgetExceeded` from the model call, a
``GraphRecursionError``: what LangGraph ends a run with on its own step limit (``recursion_limit``),
so a graph and its callers end the way they already handle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.errors import GraphRecursionError

from otel_guard.usage import (
    aafter_model_request,
    abefore_model_request,
    after_model_request,
    before_model_request,
    model_requests_counted,
)

Wrapped = Callable[..., Any]


class TreeBudgetExceeded(GraphRecursionError):
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens``."""


def model_run_started(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``CallbackManager.on_chat_model_start`` / ``on_llm_start``: the request, checked first."""
    if model_requests_counted():
        refused = before_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
    return wrapped(*args, **kwargs)


async def amodel_run_started(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``AsyncCallbackManager.on_chat_model_start`` / ``on_llm_start``: as :func:`model_run_started`."""
    if model_requests_counted():
        refused = await abefore_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
    return await wrapped(*args, **kwargs)


def model_run_ended(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``CallbackManagerForLLMRun.on_llm_end(response)``: the response's tokens, counted."""
    result = wrapped(*args, **kwargs)
    if model_requests_counted():
        after_model_request(tokens_of(args[0] if args else kwargs.get("response")))
    return result


async def amodel_run_ended(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: Any
) -> Any:
    """``AsyncCallbackManagerForLLMRun.on_llm_end(response)``: as :func:`model_run_ended`."""
    result = await wrapped(*args, **kwargs)
    if model_requests_counted():
        await aafter_model_request(tokens_of(args[0] if args else kwargs.get("response")))
    return result


def tokens_of(response: Any) -> int:
    """Input + output tokens of an ``LLMResult``: its messages' ``usage_metadata``, else ``llm_output``."""
    tokens = 0
    for generations in getattr(response, "generations", None) or ():
        for generation in generations:
            usage = getattr(getattr(generation, "message", None), "usage_metadata", None)
            if usage:
                tokens += int(usage.get("input_tokens", 0) or 0) + int(usage.get("output_tokens", 0) or 0)
    if tokens:
        return tokens
    output = getattr(response, "llm_output", None) or {}
    usage = output.get("token_usage") or output.get("usage") or {}
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int):
            return total
        return int(usage.get("prompt_tokens", 0) or 0) + int(usage.get("completion_tokens", 0) or 0)
    return 0
