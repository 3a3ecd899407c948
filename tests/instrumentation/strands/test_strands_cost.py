"""A tree's budget in money in Strands (issue 44.4), with the tests' ``strands.models.Model`` subclass.

Planner asks budget through a tool; budget answers. Each scripted response reports 10 input and 5
output tokens, and each model its ``model_id`` in ``get_config()`` (``scripted-planner``,
``scripted-budget``), as Strands' models do; at the ``prices`` file's 1,000 and 2,000 per million
tokens a response costs 20,000 micro-units (0.02).
"""

from __future__ import annotations

import time
from typing import Any

from strands_loop import Loop, build_loop
from strands_support import instrumented_fixture

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.strands import StrandsInstrumentor
from otel_guard.instrumentation.strands._usage import model_usage

instrumented = instrumented_fixture()

PRICES = {"scripted-*": {"input": 1000, "output": 2000}}
PER_RESPONSE = 20_000


def tree() -> Loop:
    return build_loop(max_tool_calls=1)


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


async def test_every_response_of_the_tree_is_priced_by_its_model_id(
    instrumented: StrandsInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        result = await loop.planner().invoke_async("plan the offsite")
    assert result.stop_reason == "end_turn"
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


async def test_a_tree_past_max_cost_stops_as_strands_own_token_cap_does(
    instrumented: StrandsInstrumentor,
) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    loop = tree()
    result = await loop.planner().invoke_async("plan the offsite")
    # planner 0.02, budget 0.04; the planner's answer is not requested.
    assert result.stop_reason == "limit_total_tokens"
    assert "has spent its 0.03 USD (max_cost 0.03)" in str(result)
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)


class Configured:
    def get_config(self) -> dict[str, Any]:
        return {"model_id": "claude-sonnet-4-5"}


def test_cached_tokens_are_read_whether_the_provider_counts_them_in_input_or_apart() -> None:
    # Anthropic's and Bedrock's way: inputTokens leaves the cache out, totalTokens holds it.
    apart = {"inputTokens": 100, "outputTokens": 10, "totalTokens": 410, "cacheReadInputTokens": 300}
    usage = model_usage(apart, Configured())
    assert (usage.model, usage.input_tokens, usage.cache_read_tokens) == ("claude-sonnet-4-5", 400, 300)
    assert usage.tokens == 110  # max_tokens counts what it counted before
    # OpenAI's way: inputTokens holds the cached ones.
    within = {"inputTokens": 400, "outputTokens": 10, "totalTokens": 410, "cacheReadInputTokens": 300}
    usage = model_usage(within, object())
    assert (usage.model, usage.input_tokens, usage.cache_read_tokens, usage.tokens) == (None, 400, 300, 410)
