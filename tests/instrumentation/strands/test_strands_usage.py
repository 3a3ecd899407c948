"""A tree's model requests and tokens in Strands: counted over the tree's every run.

Planner asks budget through a tool; budget answers at once. The tree's model requests: planner's
first (the tool call), budget's one, planner's answer: three, in two runs of two agents. Each
scripted response reports 10 input and 5 output tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands_loop import Loop, build_loop
from strands_support import guard_spans, instrumented_fixture

import otel_guard
from otel_guard.instrumentation.strands import StrandsInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_spent_requests, hop_named

instrumented = instrumented_fixture()


def tree() -> Loop:
    return build_loop(max_tool_calls=1)  # planner's one tool call; budget then answers without tools


async def test_a_tree_that_made_its_model_requests_ends_the_run_at_strands_turn_limit(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = tree()

    result = await loop.planner().invoke_async("plan the offsite")

    # Planner's tool call and budget's answer were made; planner's third request, in its own run
    # but the same tree, was not: the run stopped as Strands' own `limits={"turns": ...}` stops one.
    assert result.stop_reason == "limit_turns"
    assert "has made its 2 model requests (max_model_requests 2)" in str(result)
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


async def test_with_room_for_them_every_request_is_made(instrumented: StrandsInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = tree()

    result = await loop.planner().invoke_async("plan the offsite")

    assert result.stop_reason == "end_turn"
    assert str(result).startswith("planner answers after success: budget answers without tools")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)


async def test_each_run_of_a_tree_counts_in_the_same_budget_and_two_trees_apart(
    instrumented: StrandsInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own budget of three
        assert (await tree().planner().invoke_async("plan the offsite")).stop_reason == "end_turn"
    with otel_guard.delegate("coordinator"):  # one tree for both runs: 6 requests wanted, 3 allowed
        assert (await tree().planner().invoke_async("plan the offsite")).stop_reason == "end_turn"
        # The tree made its requests: the next run is a hop the tree may not make either.
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            await tree().planner().invoke_async("plan it again")
    assert refused.value.reason == "budget"


async def test_a_tree_that_spent_its_tokens_makes_no_more_requests_nor_hops(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    # One token: the first request may be made (nothing spent yet) and spends fifteen.
    otel_guard.configure(max_tokens=1)
    loop = tree()

    result = await loop.planner().invoke_async("plan the offsite")

    assert result.stop_reason == "limit_total_tokens"
    assert "has spent its 1 model tokens (max_tokens 1)" in str(result)
    assert len(loop.planner_model.requests) == 1
    assert loop.budget_model.requests == []  # the tool hop that would run budget was refused
    refused = hop_named(spans, "execute_tool ask_budget")
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.budget.exhausted"] == "tokens"


async def test_observe_mode_lets_the_requests_through_and_records_would_refuse(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    loop = tree()

    result = await loop.planner().invoke_async("plan the offsite")

    assert result.stop_reason == "end_turn"
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)
    # Planner's first request is the tree's one; budget's run (a hop) and the requests after it
    # would have been refused.
    assert_observe_mode_recorded_the_spent_requests(spans, ("execute_tool ask_budget", "invoke_agent budget"))


async def test_with_the_usage_budgets_off_no_request_is_counted(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=6)

    result = await loop.planner().invoke_async("plan the offsite")

    # The loop is stopped by the cycle rule only; no budget event on any hop.
    assert result.stop_reason == "end_turn"
    assert not [
        e for s in guard_spans(spans) for e in s.events if e.attributes.get("otel_guard.reason") == "budget"
    ]
