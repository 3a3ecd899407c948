"""A tree's model requests and tokens in pydantic-ai: a capability added to every guarded run.

pydantic-ai's own extension point for model requests is a capability: ``prepare_model_request`` runs
before each attempt at a model request (each one the model is asked, and bills), ``after_model_request``
after each response. The instrumentor adds :class:`TreeBudget` to the ``capabilities`` of each run it
guards while ``max_model_requests`` or ``max_tokens`` is on. A request the tree may not make ends the
run as pydantic-ai ends one on its own ``UsageLimits``: ``UsageLimitExceeded``, raised from the run.
Tokens are the response's ``input_tokens + output_tokens``.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import UsageLimitExceeded

from otel_guard.usage import aafter_model_request, abefore_model_request


class TreeBudget(AbstractCapability[Any]):
    """Checks and counts each model request of a run against its delegation tree's budgets."""

    async def prepare_model_request(self, ctx: Any, request_context: Any) -> Any:
        refused = await abefore_model_request()
        if refused is not None:
            raise UsageLimitExceeded(refused)
        return request_context

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
        usage = getattr(response, "usage", None)
        tokens = (getattr(usage, "input_tokens", 0) or 0) + (getattr(usage, "output_tokens", 0) or 0)
        await aafter_model_request(tokens)
        return response


def with_tree_budget(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``Agent.iter`` keyword arguments with :class:`TreeBudget` among the run's capabilities."""
    given = kwargs.get("capabilities")
    return {**kwargs, "capabilities": [*(given or ()), TreeBudget()]}
