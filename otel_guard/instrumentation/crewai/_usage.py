"""A tree's model requests and tokens in CrewAI: CrewAI's own model-call hooks.

CrewAI runs ``before_llm_call`` hooks before each request an agent's executor makes to its model
and ``after_llm_call`` hooks after each text answer. With ``max_model_requests`` or ``max_tokens``
on, the before hook counts the request against the tree of the run it belongs to; a request the
tree may not make is stopped the way CrewAI stops a model call on a hook's word: the hook raises
:class:`TreeBudgetExceeded`, a ``HookAborted``, which CrewAI treats as a deliberate stop (never
retried, never fed back to the model as an error) and which ends the run, and the crew above it.

Tokens are what CrewAI's own accounting says the model spent (``llm.get_token_usage_summary()``,
input + output, as its providers report them): the growth of that total since the guard last read
it is added to the tree before each request, after each text answer, and before each tool call the
model asks for (a model call that returns tool calls has no after hook), so a tool call that would
run past ``max_tokens`` is refused like any hop of a spent tree. An LLM object shared by agents of
two trees running at the same time cannot tell whose request spent what: the growth goes to the
tree that reads it first. With ``max_cost`` on the growth is priced as the LLM's ``model``: its
prompt tokens as input (``cached_prompt_tokens`` and ``cache_creation_tokens`` at the cache prices),
its completion tokens as output. CrewAI's LLMs report no cost of the provider's.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from crewai.hooks import HookAborted

from otel_guard.usage import ModelUsage, after_model_request, before_model_request, model_requests_counted

_FIELDS = (
    "total_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cached_prompt_tokens",
    "cache_creation_tokens",
)
"""What the guard reads of ``get_token_usage_summary()``, in :class:`_TokenTotals`' order."""


class TreeBudgetExceeded(HookAborted):  # type: ignore[misc, unused-ignore]  # Any without crewai
    """The run's delegation tree made its ``max_model_requests`` or spent its ``max_tokens``."""


class _TokenTotals:
    """The token counts last read from each LLM object (weakly held: an LLM that is gone is forgotten)."""

    def __init__(self) -> None:
        self._read: dict[int, tuple[weakref.ref[Any], tuple[int, ...]]] = {}
        self._lock = threading.Lock()

    def growth(self, llm: Any) -> ModelUsage:
        """What ``llm`` reports spent since the last read (nothing at the first read: the baseline)."""
        summary = getattr(llm, "get_token_usage_summary", None)
        model = getattr(llm, "model", None)
        model = model if isinstance(model, str) and model else None
        if summary is None:
            return ModelUsage(model)
        usage = summary()
        counts = tuple(int(getattr(usage, name, 0) or 0) for name in _FIELDS)
        key = id(llm)
        with self._lock:
            seen = self._read.get(key)
            if seen is None or seen[0]() is not llm:
                self._read[key] = (weakref.ref(llm, lambda _gone: self._read.pop(key, None)), counts)
                return ModelUsage(model)
            self._read[key] = (seen[0], counts)
        total, prompt, completion, cached, written = (
            max(n - was, 0) for n, was in zip(counts, seen[1], strict=True)
        )
        return ModelUsage(model, prompt, completion, cached, written, counted_tokens=total)


_totals = _TokenTotals()


def count_tokens(llm: Any) -> None:
    """Add what ``llm`` spent since the last read to the current tree (when model budgets are on)."""
    if model_requests_counted():
        after_model_request(_totals.growth(llm))


def before_model_call(hook: Any) -> None:
    """CrewAI's ``before_llm_call`` hook: count the tokens spent so far, then the request."""
    if not model_requests_counted():
        return
    after_model_request(_totals.growth(hook.llm))
    refused = before_model_request()
    if refused is not None:
        raise TreeBudgetExceeded(refused, source="otel-guard")


def after_model_call(hook: Any) -> None:
    """CrewAI's ``after_llm_call`` hook: count the tokens of the answer."""
    count_tokens(hook.llm)
