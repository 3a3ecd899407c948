"""A tree's model requests and tokens in smolagents: the agent's model, counted while it runs.

smolagents has no hook around a model request: an agent calls ``self.model.generate`` (or
``generate_stream``) for each step, each planning step, and the final answer after ``max_steps``.
While ``max_model_requests`` or ``max_tokens`` is on, a guarded run puts :class:`ModelInBudget`, a
transparent proxy of the agent's model, in ``agent.model`` for the run, and the agent's own model back
when the run ends (a streamed run: when its steps end). Each request is checked and counted against
the run's tree before it is sent; the response's ``input_tokens + output_tokens`` are added after
(a stream's, summed over its deltas). With ``max_cost`` on they are priced as the model's
``model_id`` (``gpt-4o``, ``openrouter/...``); a cost an OpenAI-compatible provider reported in the
raw response's ``usage`` (OpenRouter's ``usage.cost``) comes first.

A request the tree may not make is not sent: the proxy raises :class:`TreeBudgetExceeded`, an
``AgentGenerationError``, smolagents' error for a model that could not answer, which ends the run
(smolagents raises it from ``run``; it is never fed back to the model). In a managed agent, the
manager's step fails on it and the manager's next request is refused the same way, so the whole
tree ends. The refusal (in observe mode, the would-refuse) is an event on the span of the run's hop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import wrapt
from smolagents.utils import AgentGenerationError

from otel_guard._pricing import charged_in
from otel_guard.usage import ModelUsage, after_model_request, before_model_request, model_requests_counted

if TYPE_CHECKING:
    _ModelProxy = wrapt.ObjectProxy[Any]
else:  # wrapt < 2 has no subscriptable proxy type
    _ModelProxy = wrapt.ObjectProxy


class TreeBudgetExceeded(AgentGenerationError):  # type: ignore[misc, unused-ignore]  # Any without smolagents
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens``."""


def count_requests_of(agent: Any) -> Callable[[], None] | None:
    """Put :class:`ModelInBudget` in ``agent.model``; the call that puts the agent's model back
    (``None``: the model is counted already, by a run of the agent this one is inside)."""
    model = agent.model
    if isinstance(model, ModelInBudget):
        return None
    agent.model = ModelInBudget(model, agent.logger)

    def restore() -> None:
        agent.model = model

    return restore


class ModelInBudget(_ModelProxy):
    """An agent's model whose requests count against the tree of the run they are made in."""

    def __init__(self, model: Any, logger: Any) -> None:
        super().__init__(model)
        self._self_logger = logger

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        message = self.__wrapped__.generate(*args, **kwargs)
        after_model_request(self._usage(getattr(message, "token_usage", None), getattr(message, "raw", None)))
        return message

    @property
    def generate_stream(self) -> Callable[..., Iterator[Any]]:
        # A property, so a model without generate_stream still has none (smolagents asks hasattr).
        stream = self.__wrapped__.generate_stream
        return lambda *args, **kwargs: self._streamed(stream, args, kwargs)

    def _streamed(self, stream: Callable[..., Any], args: Any, kwargs: Any) -> Iterator[Any]:
        self._check()
        input_tokens = output_tokens = 0
        try:
            for delta in stream(*args, **kwargs):
                usage = getattr(delta, "token_usage", None)
                input_tokens += int(getattr(usage, "input_tokens", 0) or 0)
                output_tokens += int(getattr(usage, "output_tokens", 0) or 0)
                yield delta
        finally:
            after_model_request(ModelUsage(self._model_id(), input_tokens, output_tokens))

    def _model_id(self) -> str | None:
        model_id = getattr(self.__wrapped__, "model_id", None)
        return model_id if isinstance(model_id, str) else None

    def _usage(self, usage: Any, raw: Any) -> ModelUsage:
        """What a response used: its ``token_usage``, priced as the model's ``model_id``."""
        return ModelUsage(
            self._model_id(),
            int(getattr(usage, "input_tokens", 0) or 0),
            int(getattr(usage, "output_tokens", 0) or 0),
            reported_cost=charged_in(raw),
        )

    def _check(self) -> None:
        """Count the request; raise :class:`TreeBudgetExceeded` when the tree may not make it."""
        if not model_requests_counted():
            return
        refused = before_model_request()
        if refused is not None:
            raise TreeBudgetExceeded(refused, self._self_logger)
