"""A tree's model requests and tokens in Haystack: counted over the tree's every Agent run.

Planner asks budget through an ``AgentTool``; budget answers at once. The tree's model requests:
planner's first (the tool call), budget's one, planner's answer: three, in two runs of two Agents.
Each scripted reply reports 10 prompt and 5 completion tokens in ``meta["usage"]``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from haystack_loop import Loop, agent_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.instrumentation.haystack import HaystackInstrumentor
from tests.hop_spans import decisions, hop_named

instrumented = instrumentor_fixture(HaystackInstrumentor)

SPENT_REQUESTS = r"has made its {n} model requests \(max_model_requests {n}\)"


def tree() -> Loop:
    return agent_loop(depth=2, max_tool_calls=1)


def requests(loop: Loop) -> tuple[int, int]:
    return len(loop.models_of("planner")[0].requests), len(loop.models_of("budget")[0].requests)


def test_a_spent_tree_ends_the_run_with_the_refusal_as_its_result(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = tree()

    result = loop.run()

    # Planner's tool call and budget's answer were made; planner's third request was not sent: the
    # run stopped as a hook stops it, with the refusal as its exit reason and its last message.
    assert requests(loop) == (1, 1)
    assert result["exit_reason"] == result["last_message"].text
    assert result["last_message"].role.value == "assistant"
    assert re.search(SPENT_REQUESTS.format(n=2), result["exit_reason"])
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_refusal_deep_in_a_sub_agent_ends_the_root_run_with_the_refusal(
    instrumented: HaystackInstrumentor, spans: Any, run: str
) -> None:
    otel_guard.configure(max_model_requests=2, cycle_rule="none")  # the budget, not the cycle, stops it
    loop = agent_loop(depth=3, max_tool_calls=2)  # planner -> budget -> planner

    result = loop.run() if run == "sync" else asyncio.run(loop.run_async())

    # Planner's request and budget's were made. Budget's call into the inner planner was a hop of a
    # spent tree (refused, reason budget), and budget's next request was not sent: budget's run
    # ended with the refusal as its answer to planner, whose next request was refused too. Every
    # run ended, each with the refusal as its result: no hang, no success-shaped empty answer.
    planner, budget, inner = (len(model.requests) for model in loop.models)
    assert (planner, budget, inner) == (1, 1, 0)
    assert [d[:2] for d in decisions(spans)][-1] == ("invoke_agent planner", "refuse")
    (answer,) = [m for m in result["messages"] if m.tool_call_result is not None]
    assert str(answer.tool_call_result.result).startswith("Delegation budget:")
    assert "has made its 2 model requests (max_model_requests 2)" in str(answer.tool_call_result.result)
    assert result["last_message"].text.startswith("Delegation budget:")
    assert result["exit_reason"] == result["last_message"].text


def test_with_room_for_them_every_request_is_made(instrumented: HaystackInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = tree()

    result = loop.run()

    assert requests(loop) == (2, 1)
    assert result["last_message"].text == "planner answers after budget answers without tools"


def test_each_run_of_a_tree_counts_in_the_same_budget_and_two_trees_apart(
    instrumented: HaystackInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own budget of three
        assert tree().run()["exit_reason"] == "text"
    with otel_guard.delegate("coordinator"):  # one tree for both runs: 6 requests wanted, 3 allowed
        tree().run()
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            tree().run(pipeline=False)
    assert refused.value.reason == "budget"


def test_a_tree_that_spent_its_tokens_makes_no_more_requests(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_tokens=20)
    loop = tree()

    result = loop.run()

    # 15 tokens after planner's first reply, 30 after budget's: planner's answer was not asked for.
    assert requests(loop) == (1, 1)
    assert "max_tokens 20" in result["exit_reason"]
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.budget.exhausted"] == "tokens"


def test_observe_mode_makes_every_request_and_records_the_would_refuse(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_model_requests=2)
    loop = tree()

    result = loop.run()

    assert requests(loop) == (2, 1)
    assert result["exit_reason"] == "text"
    events = [e.name for e in hop_named(spans, "invoke_agent planner").events]
    assert events == ["otel_guard.would_refuse"]
