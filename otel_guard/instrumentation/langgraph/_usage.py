"""A tree's model requests and tokens in LangChain / LangGraph: at LangChain's model callbacks.

Every model call of LangChain (a chat model's or an LLM's ``invoke``, ``stream``, ``batch``, sync or
async) starts its run through ``CallbackManager.on_chat_model_start`` / ``on_llm_start`` and ends it
through ``on_llm_end`` of the run's manager. The instrumentor checks the tree's budgets and counts the
request *before* the callbacks run (so no tracer opens a span for a request that is not made), and
adds the response's tokens at ``on_llm_end``: the ``usage_metadata`` of each generation's message
(input + output tokens), or the ``token_usage`` an LLM reports in its ``llm_output``. With
``max_cost`` on each is priced by the model its message's ``response_metadata`` names
(``model_name``, as ``ChatOpenAI``, ``ChatAnthropic`` and most integrations write it, or ``model``),
its cache tokens (``input_token_details``' ``cache_read`` and ``cache_creation``), and a cost the
provider reported (``token_usage["cost"]``: OpenRouter's actual charge, which ``ChatOpenAI`` keeps).

A request the tree may not make raises :class:`TreeBudgetExceeded` from the model call, a
``GraphRecursionError``: what LangGraph ends a run with on its own step limit (``recursion_limit``),
so a graph and its callers end the way they already handle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langgraph.errors import GraphRecursionError

from otel_guard._pricing import reported_cost
from otel_guard.usage import (
    ModelUsage,
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
        for usage in usages_of(args[0] if args else kwargs.get("response")):
            after_model_request(usage)
    return result


async def amodel_run_ended(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: Any
) -> Any:
    """``AsyncCallbackManagerForLLMRun.on_llm_end(response)``: as :func:`model_run_ended`."""
    result = await wrapped(*args, **kwargs)
    if model_requests_counted():
        for usage in usages_of(args[0] if args else kwargs.get("response")):
            await aafter_model_request(usage)
    return result


def usages_of(response: Any) -> list[ModelUsage]:
    """What an ``LLMResult`` used: one usage a generation whose message reports ``usage_metadata``,
    else one from the ``token_usage`` an LLM reports in its ``llm_output``."""
    output = getattr(response, "llm_output", None) or {}
    usages = []
    for generations in getattr(response, "generations", None) or ():
        for generation in generations:
            message = getattr(generation, "message", None)
            usage = getattr(message, "usage_metadata", None)
            if usage:
                metadata = getattr(message, "response_metadata", None) or {}
                details = usage.get("input_token_details") or {}
                usages.append(
                    ModelUsage(
                        _model(metadata) or _model(output),
                        int(usage.get("input_tokens", 0) or 0),
                        int(usage.get("output_tokens", 0) or 0),
                        int(details.get("cache_read", 0) or 0),
                        int(details.get("cache_creation", 0) or 0),
                        _charged(metadata) if _charged(metadata) is not None else _charged(output),
                    )
                )
    if usages:
        return usages
    usage = output.get("token_usage") or output.get("usage") or {}
    if not isinstance(usage, dict):
        return []
    prompt = int(usage.get("prompt_tokens", 0) or 0)
    completion = int(usage.get("completion_tokens", 0) or 0)
    total = usage.get("total_tokens")
    if not prompt and not completion and isinstance(total, int):
        prompt = total
    return [ModelUsage(_model(output), prompt, completion, reported_cost=_charged(output))]


def _model(metadata: Any) -> str | None:
    name = metadata.get("model_name") or metadata.get("model") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def _charged(metadata: Any) -> Any:
    """A cost the provider reported in its usage (``token_usage["cost"]``), or ``None``."""
    usage = metadata.get("token_usage") if isinstance(metadata, dict) else None
    return reported_cost(usage.get("cost")) if isinstance(usage, dict) else None
