"""A tree's budget in money in Haystack (issue 46), on the tests' scripted chat generator.

Planner asks budget through an ``AgentTool``; budget answers at once. Each scripted reply reports 10
prompt and 5 completion tokens in ``meta["usage"]`` and its model in ``meta["model"]``
(``scripted-planner``, ``scripted-budget``), as OpenAI's generators do; at the ``prices`` file's 1,000
and 2,000 per million tokens a response costs 10 * 1,000 + 5 * 2,000 = 20,000 micro-units (0.02). The
tree's three requests: planner's tool call, budget's answer, planner's answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack_loop import Loop, agent_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard._pricing import price
from otel_guard.budget import store_for
from otel_guard.instrumentation.haystack import HaystackInstrumentor
from otel_guard.instrumentation.haystack._cost import model_usage
from tests.hop_spans import hop_named

instrumented = instrumentor_fixture(HaystackInstrumentor)

PRICES = {"scripted-*": {"input": 1000, "output": 2000}}
PER_RESPONSE = 20_000


def tree() -> Loop:
    return agent_loop(depth=2, max_tool_calls=1)


def requests(loop: Loop) -> tuple[int, int]:
    return len(loop.models_of("planner")[0].requests), len(loop.models_of("budget")[0].requests)


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


@pytest.mark.parametrize("run", ["sync", "async"])
def test_every_response_of_the_tree_is_priced_by_its_model(
    instrumented: HaystackInstrumentor, run: str
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        result = loop.run() if run == "sync" else asyncio.run(loop.run_async())
    assert result["last_message"].text == "planner answers after budget answers without tools"
    assert requests(loop) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


def test_a_tree_past_max_cost_ends_the_run_with_the_refusal_as_its_result(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.04", prices=PRICES)
    loop = tree()

    result = loop.run()

    # 0.02 after planner's tool call, 0.04 after budget's answer: planner's answer was not asked for.
    assert requests(loop) == (1, 1)
    assert result["exit_reason"] == result["last_message"].text
    assert "has spent its 0.04 USD (max_cost 0.04); the model request is refused" in result["exit_reason"]
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.budget.exhausted"] == "cost"


def test_a_model_no_price_covers_is_unpriced(instrumented: HaystackInstrumentor, metric_reader: Any) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse")
    loop = tree()

    result = loop.run()

    assert "no price covers" in result["exit_reason"]
    assert requests(loop) == (1, 0)
    counted = {
        attributes.get("gen_ai.request.model")
        for attributes, _ in metric_reader.points("otel_guard.budget.unpriced")
    }
    assert "scripted-planner" in counted


def test_anthropic_usage_prices_its_cache_tokens_and_counts_its_own_tokens() -> None:
    # Haystack's AnthropicChatGenerator passes Anthropic's usage on: input_tokens leave the cached out.
    usage = {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 20,
    }
    reply = ChatMessage.from_assistant("hi", meta={"model": "claude-x", "usage": usage})
    used = model_usage([reply])
    assert (used.model, used.input_tokens, used.cache_read_tokens, used.cache_write_tokens) == (
        "claude-x",
        130,
        100,
        20,
    )
    assert used.tokens == 15  # max_tokens counts what the provider reported, as before
    entry = {"claude-*": {"input": 1000, "output": 2000, "cache_read": 100, "cache_write": 1250}}
    otel_guard.configure(max_cost="1", prices=entry)
    assert price(used, otel_guard.settings.current_settings()) == 10 * 1000 + 5 * 2000 + 100 * 100 + 20 * 1250


def test_the_choices_of_one_response_count_its_usage_once() -> None:
    # OpenAI's n=2: Haystack's OpenAIChatGenerator gives each choice's reply the completion's usage.
    usage = {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}
    replies = [
        ChatMessage.from_assistant(text, meta={"model": "gpt-x", "index": index, "usage": dict(usage)})
        for index, text in enumerate(("one", "two"))
    ]
    used = model_usage(replies)
    assert (used.tokens, used.input_tokens, used.output_tokens) == (16, 10, 6)
