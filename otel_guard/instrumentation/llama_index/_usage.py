"""A tree's model requests and tokens in LlamaIndex: each agent step's model request, checked and counted.

An agent's ``take_step`` (``FunctionAgent``, ``ReActAgent``, ``CodeActAgent``) is one step of its
run: it sends the run's messages to the model once (streamed or not) and turns the response into the
step's ``AgentOutput``. While ``max_model_requests`` or ``max_tokens`` is on, the patched step first
counts the request against the run's tree; a request the tree may not make is not sent: the step
raises :class:`TreeBudgetExceeded`, a ``WorkflowRuntimeError`` as LlamaIndex's own per-run limit
("Max iterations of 20 reached!") is, which ends the run. Every other run of the tree (a caller
waiting on this one through a tool reads the error as the tool's result) ends the same way at its
next step. After the step, the response's tokens (input + output, as LlamaIndex's own
``get_tokens_from_response`` reads them from the provider's raw response) are added to the tree.
With ``max_cost`` on they are priced as the model the raw response names (``model``, as OpenAI's
does), else the agent's LLM (``llm.metadata.model_name``), with the cached input tokens the raw
usage reports (``prompt_tokens_details.cached_tokens``); a cost the provider reported in it
(OpenRouter's ``usage.cost``) comes first.
The refusal (in observe mode, the would-refuse) is an event on the span of the hop the agent runs in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.callbacks.token_counting import get_tokens_from_response
from opentelemetry import context as otel_context
from workflows.errors import WorkflowRuntimeError

from otel_guard._pricing import charged_in
from otel_guard.instrumentation.llama_index._scope import RUN, Run
from otel_guard.usage import ModelUsage, aafter_model_request, abefore_model_request, model_requests_counted


class TreeBudgetExceeded(WorkflowRuntimeError):  # type: ignore[misc, unused-ignore]  # Any without LlamaIndex
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens``."""


def guard_model_request(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Awaitable[Any]:
    """``FunctionAgent.take_step`` (and ReAct's, CodeAct's): the step's request counted against its
    tree. Not a coroutine itself: with no model budget on, the step is LlamaIndex's own coroutine."""
    if not model_requests_counted():
        return wrapped(*args, **kwargs)
    return _counted_step(wrapped, instance, args, kwargs)


async def _counted_step(
    wrapped: Callable[..., Awaitable[Any]], agent: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    run = otel_context.get_value(RUN)
    in_charge = run.in_charge if isinstance(run, Run) else None
    token = otel_context.attach(in_charge) if in_charge is not None else None
    try:
        refused = await abefore_model_request()
    finally:
        if token is not None:
            otel_context.detach(token)
    if refused is not None:
        raise TreeBudgetExceeded(refused)
    output = await wrapped(*args, **kwargs)
    # The step's output keeps the provider's raw response, where its usage is.
    raw = getattr(output, "raw", None)
    response = ChatResponse(message=ChatMessage(), raw=raw)
    prompt, completion = get_tokens_from_response(response)
    await aafter_model_request(
        ModelUsage(
            _model_name(raw, agent),
            int(prompt or 0),
            int(completion or 0),
            _cached_tokens(raw),
            reported_cost=charged_in(raw),
        )
    )
    return output


def _model_name(raw: Any, agent: Any) -> str | None:
    """The model the raw response names, else the one the agent's LLM says it is (not ``unknown``,
    LlamaIndex's placeholder)."""
    name = raw.get("model") if isinstance(raw, dict) else getattr(raw, "model", None)
    if isinstance(name, str) and name:
        return name
    metadata = getattr(getattr(agent, "llm", None), "metadata", None)
    name = getattr(metadata, "model_name", None)
    return name if isinstance(name, str) and name and name != "unknown" else None


def _cached_tokens(raw: Any) -> int:
    """Input tokens the raw usage reports read from the provider's cache (OpenAI's form)."""
    usage = raw.get("usage") if isinstance(raw, dict) else getattr(raw, "usage", None)
    details = (
        usage.get("prompt_tokens_details")
        if isinstance(usage, dict)
        else getattr(usage, "prompt_tokens_details", None)
    )
    cached = (
        details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", None)
    )
    return cached if isinstance(cached, int) and cached > 0 else 0
