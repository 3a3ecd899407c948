"""A tree's model requests and tokens in Agent Framework: counted over the tree's every run.

Planner asks budget through a tool; budget answers at once. The tree's model requests: planner's
first (the tool call), budget's one, planner's answer: three, in two runs of two agents. Each
scripted response reports 10 input and 5 output tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework_loop import Loop, build_loop
from agent_framework_support import guard_spans, instrumented_fixture

import otel_guard
from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_spent_requests, hop_named

instrumented = instrumented_fixture()


def tree() -> Loop:
    return build_loop(max_tool_calls=1)  # planner's one tool call; budget then answers without tools


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_a_tree_that_made_its_model_requests_ends_the_run_with_a_last_answer(
    instrumented: AgentFrameworkInstrumentor, spans: Any, streamed: bool
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = tree()

    if streamed:
        stream = loop.planner.run("plan the offsite", stream=True)
        async for _update in stream:
            pass
        result = await stream.get_final_response()
    else:
        result = await loop.planner.run("plan the offsite")

    # Planner's tool call and budget's answer were made; planner's third request, in its own run
    # but the same tree, was not: the run ended with the reason as its last answer, as Agent
    # Framework ends a run at its own max_iterations.
    assert "has made its 2 model requests (max_model_requests 2)" in result.text
    assert result.finish_reason == "length"
    assert (len(loop.planner_client.requests), len(loop.budget_client.requests)) == (1, 1)
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


async def test_with_room_for_them_every_request_is_made(instrumented: AgentFrameworkInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = tree()

    result = await loop.planner.run("plan the offsite")

    assert result.text == "planner answers after budget answers without tools"
    assert (len(loop.planner_client.requests), len(loop.budget_client.requests)) == (2, 1)


async def test_each_run_of_a_tree_counts_in_the_same_budget_and_two_trees_apart(
    instrumented: AgentFrameworkInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own budget of three
        assert "max_model_requests" not in (await tree().planner.run("plan the offsite")).text
    with otel_guard.delegate("coordinator"):  # one tree for both runs: 6 requests wanted, 3 allowed
        assert "max_model_requests" not in (await tree().planner.run("plan the offsite")).text
        # The tree made its requests: the next run is a hop the tree may not make either.
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            await tree().planner.run("plan it again")
    assert refused.value.reason == "budget"


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_a_tree_that_spent_its_tokens_makes_no_more_requests_nor_hops(
    instrumented: AgentFrameworkInstrumentor, spans: Any, streamed: bool
) -> None:
    # One token: the first request may be made (nothing spent yet) and spends fifteen.
    otel_guard.configure(max_tokens=1)
    loop = tree()

    if streamed:
        stream = loop.planner.run("plan the offsite", stream=True)
        async for _update in stream:
            pass
        result = await stream.get_final_response()
    else:
        result = await loop.planner.run("plan the offsite")

    assert "has spent its 1 model tokens (max_tokens 1)" in result.text
    assert len(loop.planner_client.requests) == 1  # the tool call; the answer was refused before it was sent
    assert loop.budget_client.requests == []  # the tool hop that would run budget was refused
    refused = hop_named(spans, "execute_tool ask_budget")
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.budget.exhausted"] == "tokens"


async def test_observe_mode_lets_the_requests_through_and_records_would_refuse(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    loop = tree()

    result = await loop.planner.run("plan the offsite")

    assert result.text == "planner answers after budget answers without tools"
    assert (len(loop.planner_client.requests), len(loop.budget_client.requests)) == (2, 1)
    # Planner's first request is the tree's one; the tool call, budget's run (hops) and the
    # requests after them would have been refused.
    assert_observe_mode_recorded_the_spent_requests(spans, ("execute_tool ask_budget", "invoke_agent budget"))


async def test_with_the_usage_budgets_off_no_request_is_counted(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=6)

    await loop.planner.run("plan the offsite")

    # The loop is stopped by the cycle rule only; no budget event on any hop.
    assert loop.calls.made == 2
    assert not [
        e for s in guard_spans(spans) for e in s.events if e.attributes.get("otel_guard.reason") == "budget"
    ]
