"""A tree's model requests and tokens in pydantic-ai: a capability added to every guarded run.

pydantic-ai's own extension point for model requests is a capability: ``prepare_model_request`` runs
before each attempt at a model request (each one the model is asked, and bills), ``after_model_request``
after each response. The instrumentor adds :class:`TreeBudget` to the ``capabilities`` of each run it
guards while ``max_model_requests`` or ``max_tokens`` is on. A request the tree may not make ends the
run as pydantic-ai ends one on its own ``UsageLimits``: ``UsageLimitExceeded``, raised from the run.
Tokens are the response's ``input_tokens + output_tokens``. With ``max_cost`` on, the response is
priced by its ``model_name`` (``provider_name`` helping genai-prices) and its usage, cache tokens
included; a cost the provider charged and reported (OpenRouter's ``usage.cost``, which pydantic-ai
keeps in ``provider_details["cost"]``) comes first. ``usage.cost`` and ``ModelResponse.cost()`` are
not read: they are genai-prices' estimate (or a gateway's), which comes after the user's prices file.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import UsageLimitExceeded

from otel_guard._pricing import reported_cost
from otel_guard.usage import ModelUsage, aafter_model_request, abefore_model_request


class TreeBudgetExceeded(UsageLimitExceeded):
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens`` or
    ``max_cost``: pydantic-ai's own ``UsageLimitExceeded``. Raised in a sub-agent's run inside a
    tool, it reaches the calling agent's model as that tool's failure (as a refused hop does), and the
    caller's next request, in the same spent tree, ends the root run."""


class TreeBudget(AbstractCapability[Any]):
    """Checks and counts each model request of a run against its delegation tree's budgets."""

    async def prepare_model_request(self, ctx: Any, request_context: Any) -> Any:
        refused = await abefore_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused)
        return request_context

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
        await aafter_model_request(model_usage(response))
        return response


def model_usage(response: Any) -> ModelUsage:
    """What a ``ModelResponse`` used: its model, tokens, and a cost its provider reported."""
    usage = getattr(response, "usage", None)
    details = getattr(response, "provider_details", None)
    return ModelUsage(
        getattr(response, "model_name", None),
        int(getattr(usage, "input_tokens", 0) or 0),
        int(getattr(usage, "output_tokens", 0) or 0),
        int(getattr(usage, "cache_read_tokens", 0) or 0),
        int(getattr(usage, "cache_write_tokens", 0) or 0),
        reported_cost(details.get("cost")) if isinstance(details, dict) else None,
        provider=getattr(response, "provider_name", None),
    )


def with_tree_budget(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``Agent.iter`` keyword arguments with :class:`TreeBudget` among the run's capabilities."""
    given = kwargs.get("capabilities")
    return {**kwargs, "capabilities": [*(given or ()), TreeBudget()]}
