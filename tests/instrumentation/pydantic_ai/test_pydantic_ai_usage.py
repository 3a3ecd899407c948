"""A tree's model requests and tokens in pydantic-ai (issue 11): counted over the tree's every run.

Planner asks budget through a tool; budget answers at once. The tree's model requests: planner's
first (the tool call), budget's one, planner's answer: three, in two runs of two agents.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai_app import build_loop

import otel_guard
from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_spent_requests
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(PydanticAIInstrumentor)


def tree() -> Any:
    loop = build_loop(max_tool_calls=1)
    loop.budget_model.max_tool_calls = 0  # budget answers without delegating back
    return loop


async def test_a_tree_that_made_its_model_requests_ends_the_run_as_pydantic_ai_does(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = tree()
    with pytest.raises(UsageLimitExceeded, match=r"has made its 2 model requests \(max_model_requests 2\)"):
        await loop.planner.run("plan the offsite")
    # Planner's tool call and budget's answer were made; planner's third request, in its own run
    # but the same tree, was not.
    assert len(loop.planner_model.requests) == 1
    assert len(loop.budget_model.requests) == 1
    planner = spans.one("invoke_agent planner")
    [event] = [e for e in planner.events if e.name == "otel_guard.refused"]
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


async def test_with_room_for_them_every_request_is_made(instrumented: PydanticAIInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = tree()
    result = await loop.planner.run("plan the offsite")
    assert result.output.startswith("planner answers after ask_budget")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)


async def test_each_run_of_a_tree_counts_in_the_same_budget_and_two_trees_apart(
    instrumented: PydanticAIInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own budget of three
        loop = tree()
        await loop.planner.run("plan the offsite")
    with otel_guard.delegate("coordinator"):  # one tree for both runs: 6 requests wanted, 3 allowed
        loop = tree()
        await loop.planner.run("plan the offsite")
        # The tree made its requests: the next run is a hop the tree may not make either.
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            await tree().planner.run("plan it again")
    assert refused.value.reason == "budget"


async def test_a_tree_that_spent_its_tokens_makes_no_more_requests_nor_hops(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_tokens=10**6)
    result = await tree().planner.run("plan the offsite")
    assert result.usage.input_tokens + result.usage.output_tokens > 0  # FunctionModel reports usage
    # One token: the first request may be made (nothing spent yet) and spends more than that.
    otel_guard.configure(max_tokens=1)
    spans.clear()
    loop = tree()
    with pytest.raises(UsageLimitExceeded, match=r"has spent its 1 model tokens \(max_tokens 1\)"):
        await loop.planner.run("plan the offsite")
    assert len(loop.planner_model.requests) == 1
    assert loop.budget_model.requests == []  # the tool hop that would run budget was refused
    refused = spans.one("execute_tool ask_budget")
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.budget.exhausted"] == "tokens"


async def test_observe_mode_lets_the_request_through_and_records_a_would_refuse(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    loop = tree()
    result = await loop.planner.run("plan the offsite")
    assert result.output.startswith("planner answers after ask_budget")
    # Planner's first request is the tree's one; budget's run (a hop) and the two requests after it
    # would have been refused.
    assert_observe_mode_recorded_the_spent_requests(spans, ("execute_tool ask_budget", "invoke_agent budget"))


async def test_with_the_usage_budgets_off_no_capability_is_added(
    instrumented: PydanticAIInstrumentor,
) -> None:
    seen: list[Any] = []
    loop = tree()
    original = loop.planner.iter

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("capabilities"))
        return original(*args, **kwargs)

    loop.planner.iter = spy  # type: ignore[method-assign]
    await loop.planner.run("plan the offsite")
    assert seen == [None]
