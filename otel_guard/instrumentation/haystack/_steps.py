"""Inside an Agent's run: the tree's budgets before each model request, its tokens after, guidance.

The Agent runs its hooks at fixed points of its loop (``haystack.hooks``), through ``_run_hooks``
(``_run_hooks_async`` in ``run_async``), with the run's live ``State``; the guard acts after the
Agent's own hooks there, for every Agent, without adding a hook to any (an Agent's hooks are its
constructor's argument, and ``to_dict`` would write the guard's into a saved pipeline):

* ``before_llm``, before each model request: with ``max_model_requests``, ``max_tokens`` or
  ``max_cost`` on, the request is checked and counted against the run's tree. A request the tree may
  not make is not sent: the Agent stops the way a hook stops it, by ``state["stop_run"]``, which it
  reads before each request and returns as the run's ``exit_reason``; the refusal is also the run's
  last message (an assistant message), so an Agent called as a tool answers its caller with the
  refusal, not with what it had before. The caller's next request is refused the same way: the whole
  tree ends, every run with a result;
* after each response, ``_record_llm_usage``: the tokens of its ``meta["usage"]``
  (``prompt_tokens + completion_tokens``, or ``input_tokens + output_tokens``) go to the tree, and
  with ``max_cost`` its price, by its ``meta["model"]`` (:mod:`._cost`);
* ``before_run``, once, before the first request: with ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, a
  run whose tools include an agent on its call path gets the situational guidance at the start of
  its newest user message. The system prompt is never changed.

The refusal (in observe mode, the would-refuse) is an event on the span of the run's hop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from haystack.components.agents.state.state_utils import replace_values
from haystack.dataclasses import ChatMessage, ChatRole

from otel_guard.instrumentation.haystack._cost import model_usage
from otel_guard.instrumentation.haystack._scope import run_in_progress
from otel_guard.prompt import guidance_for
from otel_guard.settings import current_settings
from otel_guard.usage import (
    abefore_model_request,
    after_model_request,
    before_model_request,
    model_requests_counted,
)

_BEFORE_RUN: Final = "before_run"
_BEFORE_LLM: Final = "before_llm"


def _point_and_state(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(hook point, state) of a ``_run_hooks(hooks, hook_point, state)`` call."""
    point = kwargs["hook_point"] if "hook_point" in kwargs else args[1] if len(args) > 1 else None
    state = kwargs["state"] if "state" in kwargs else args[2] if len(args) > 2 else None
    return point, state


def before_step(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_run_hooks``: the Agent's hooks, then the guard's step."""
    result = wrapped(*args, **kwargs)
    point, state = _point_and_state(args, kwargs)
    if point == _BEFORE_LLM:
        if _may_count(state):
            _stop_if_refused(state, before_model_request())
    elif point == _BEFORE_RUN:
        _guide(state)
    return result


async def before_step_async(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_run_hooks_async``: as :func:`before_step`."""
    result = await wrapped(*args, **kwargs)
    point, state = _point_and_state(args, kwargs)
    if point == _BEFORE_LLM:
        if _may_count(state):
            _stop_if_refused(state, await abefore_model_request())
    elif point == _BEFORE_RUN:
        _guide(state)
    return result


def _may_count(state: Any) -> bool:
    """Whether this request is counted: a budget is on, and no hook has stopped the run already."""
    return state is not None and model_requests_counted() and state.data.get("stop_run") is None


def _stop_if_refused(state: Any, refused: str | None) -> None:
    if refused is None:
        return
    state.set("messages", [ChatMessage.from_assistant(refused)])
    state.set("stop_run", refused)


def count_tokens(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``_record_llm_usage(state, llm_messages)``: the response's tokens (and cost) go to the tree too."""
    result = wrapped(*args, **kwargs)
    messages = kwargs["llm_messages"] if "llm_messages" in kwargs else args[1] if len(args) > 1 else ()
    if model_requests_counted():
        after_model_request(model_usage(messages or ()))
    return result


def _guide(state: Any) -> None:
    """Lead the run's newest user message with the situational guidance, when it applies."""
    name = run_in_progress()
    if state is None or name is None or not current_settings().situational_prompt:
        return
    docs = {tool.name: tool.description for tool in state.data.get("tools") or ()}
    prefix = guidance_for(name, docs)
    if prefix is None:
        return
    messages = list(state.data.get("messages") or ())
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.is_from(ChatRole.USER) and message.text is not None and len(message.texts) == 1:
            messages[index] = ChatMessage.from_user(
                f"{prefix}\n\n{message.text}", meta=message.meta, name=message.name
            )
            state.set("messages", messages, handler_override=replace_values)
            return
