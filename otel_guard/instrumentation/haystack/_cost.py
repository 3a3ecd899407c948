"""What one Haystack model response used: its replies' ``meta["usage"]`` and ``meta["model"]``.

Haystack's chat generators pass the provider's usage on as they got it: OpenAI's names
(``prompt_tokens``, ``completion_tokens``, cached tokens in ``prompt_tokens_details``) or Anthropic's
(``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``).
What a reader would not guess: Anthropic's ``input_tokens`` leave the cached tokens out, so those are
added for the price (which counts every input token) and not for ``max_tokens`` (which counts
input + output as the provider reports them). A ``cost`` in the usage is a charge the provider
reported (OpenRouter's ``usage.cost``, through the OpenAI generator) and comes first. A response
of several choices (OpenAI's ``n``) gives each reply the whole response's usage: a usage equal to one
already read is that response's again, counted once (Haystack's own ``token_usage`` counts it n times).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from otel_guard._pricing import reported_cost
from otel_guard.usage import ModelUsage


def model_usage(replies: Iterable[Any]) -> ModelUsage:
    """What the replies of one model response used, summed over them; named by the first reply's model."""
    model: str | None = None
    counted = input_tokens = output_tokens = cache_read = cache_write = 0
    cost: Decimal | None = None
    read: list[dict[str, Any]] = []
    for reply in replies:
        meta = getattr(reply, "meta", None)
        if not isinstance(meta, dict):
            continue
        if model is None and isinstance(meta.get("model"), str) and meta["model"]:
            model = meta["model"]
        usage = meta.get("usage")
        if not isinstance(usage, dict) or usage in read:
            continue
        read.append(usage)
        prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
        completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
        counted += prompt + completion
        output_tokens += completion
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):  # OpenAI's: the prompt tokens include the cached ones
            cache_read += _count(details.get("cached_tokens"))
            input_tokens += prompt
        else:  # Anthropic's: the input tokens leave them out
            cached = _count(usage.get("cache_read_input_tokens"))
            written = _count(usage.get("cache_creation_input_tokens"))
            cache_read += cached
            cache_write += written
            input_tokens += prompt + cached + written
        charged = reported_cost(usage.get("cost"))
        if charged is not None:
            cost = charged if cost is None else cost + charged
    return ModelUsage(
        model, input_tokens, output_tokens, cache_read, cache_write, cost, counted_tokens=counted
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
