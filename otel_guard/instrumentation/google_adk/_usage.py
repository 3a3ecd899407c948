"""A tree's model requests and tokens in ADK: counted where ADK counts its own model calls.

ADK enforces its own model-call limit (``RunConfig.max_llm_calls``) in
``InvocationContext.increment_llm_call_count``, which the flow calls once per model request, after the
``before_model_callback``s (a request a callback answered is no request) and just before the model is
called. The instrumentor wraps it: after ADK's own check, the request is counted against the tree's
``max_model_requests`` (and refused once the tree spent its ``max_tokens``), the refusal or the
would-refuse recorded on the hop's span. A request the tree may not
make raises :class:`TreeBudgetExceeded` from there, a ``LlmCallsLimitExceededError``: the error ADK
ends a run with on its own limit, so code that handles that one handles this too. (A plugin's
``before_model_callback`` cannot end the run so: ADK wraps whatever a plugin raises in a
``RuntimeError``.)

The check is synchronous, as ADK's is: with a Redis budget store it is one blocking round trip per
model request. The tokens of each complete response (``usage_metadata.total_token_count``, else prompt
+ candidates + thoughts) are counted by the guard plugin's ``after_model_callback``
(:func:`tokens_of`); a streamed response's partial chunks are not counted. With ``max_cost`` on the
response is priced (:func:`model_usage`) as the model it names (``model_version``), else the agent's
model: prompt tokens as input (the cached content's at the cache price), candidates and thoughts as
output, as Gemini bills them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.adk.agents.invocation_context import LlmCallsLimitExceededError
from opentelemetry import trace

from otel_guard.instrumentation.google_adk._calls import hop_span
from otel_guard.usage import ModelUsage, before_model_request, model_requests_counted


class TreeBudgetExceeded(LlmCallsLimitExceededError):  # type: ignore[misc, unused-ignore]  # Any without ADK
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens``."""


def count_model_request(
    wrapped: Callable[..., None], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``InvocationContext.increment_llm_call_count()``: ADK's own limit, then the tree's."""
    wrapped(*args, **kwargs)
    if not model_requests_counted():
        return
    span = hop_span()
    if span is None:
        refused = before_model_request()
    else:
        # ADK's span of the agent is current here; a refusal belongs on the guard's hop span.
        with trace.use_span(span, end_on_exit=False):
            refused = before_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused)


def tokens_of(usage: Any) -> int:
    """The tokens a response's ``usage_metadata`` reports (0 for none)."""
    if usage is None:
        return 0
    total = getattr(usage, "total_token_count", None)
    if isinstance(total, int) and total > 0:
        return total
    counts = (
        getattr(usage, name, None)
        for name in ("prompt_token_count", "candidates_token_count", "thoughts_token_count")
    )
    return sum(count for count in counts if isinstance(count, int))


def model_usage(usage: Any, model: str | None) -> ModelUsage:
    """What a response's ``usage_metadata`` used, priced as ``model``; ``max_tokens`` counts
    :func:`tokens_of` as before."""

    def count(name: str) -> int:
        value = getattr(usage, name, None)
        return value if isinstance(value, int) and value > 0 else 0

    return ModelUsage(
        model,
        count("prompt_token_count"),
        count("candidates_token_count") + count("thoughts_token_count"),
        count("cached_content_token_count"),
        counted_tokens=tokens_of(usage),
    )


def model_name(response_model: str | None, callback_context: Any) -> str | None:
    """The model a response names (``model_version``), else the model of the agent that asked it."""
    if isinstance(response_model, str) and response_model:
        return response_model
    invocation = getattr(callback_context, "_invocation_context", None)
    model = getattr(getattr(invocation, "agent", None), "model", None)
    name = model if isinstance(model, str) else getattr(model, "model", None)
    return name if isinstance(name, str) and name else None
