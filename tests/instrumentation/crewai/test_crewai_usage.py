"""A tree's model requests and tokens in CrewAI, counted over every run of the tree.

Planner asks budget through a tool; budget answers at once. The tree's model requests: planner's
first (the tool call), budget's one, planner's answer: three, in two runs of two agents.
"""

from __future__ import annotations

from typing import Any

import pytest
from crewai.hooks import HookAborted
from crewai_app import Loop, ScriptedLLM, build_crew, build_loop

import otel_guard
from otel_guard.instrumentation.crewai._usage import TreeBudgetExceeded
from tests.hop_spans import assert_observe_mode_recorded_the_spent_requests, guard_spans


def tree(max_tool_calls: int = 1) -> Loop:
    loop = build_loop(max_tool_calls=max_tool_calls)
    loop.budget_model.max_tool_calls = 0  # budget answers without delegating back
    return loop


def test_a_tree_that_made_its_model_requests_ends_the_run_with_crewai_s_hook_abort(
    instrumented: Any, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = tree()

    with pytest.raises(
        TreeBudgetExceeded, match=r"has made its 2 model requests \(max_model_requests 2\)"
    ) as err:
        loop.run()

    assert isinstance(err.value, HookAborted)  # CrewAI's own deliberate stop: not retried
    # Planner's tool call and budget's answer were made; planner's third request, in its own run
    # but the same tree, was not.
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)
    (planner,) = [s for s in guard_spans(spans) if s.name == "invoke_agent planner"]
    [event] = [e for e in planner.events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


def test_a_crew_s_agents_count_in_their_task_s_tree(instrumented: Any) -> None:
    # The crew builds its agents' executors as it starts; the budget applies to them all the same.
    otel_guard.configure(max_model_requests=2)
    loop = build_crew(max_tool_calls=1)
    loop.budget_model.max_tool_calls = 0  # budget answers the delegated task at once

    with pytest.raises(TreeBudgetExceeded, match="has made its 2 model requests"):
        loop.run()

    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)


def test_with_room_for_them_every_request_is_made(instrumented: Any) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = tree()

    assert loop.run().startswith("planner answers after ask_budget")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)


def test_each_run_of_a_tree_counts_in_the_same_budget_and_two_trees_apart(instrumented: Any) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own budget of three
        tree().run()
    with otel_guard.delegate("coordinator"):  # one tree for both runs: 6 requests wanted, 3 allowed
        tree().run()
        # The tree made its requests: the next run is a hop the tree may not make either.
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            tree().run()
    assert refused.value.reason == "budget"


def test_a_tree_that_spent_its_tokens_makes_no_more_requests_nor_hops(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(max_tokens=10**6)
    loop = tree()
    loop.run()
    assert loop.planner_model.get_token_usage_summary().total_tokens > 0  # the model reports usage
    # One token: the first request may be made (nothing spent yet) and spends more than that.
    otel_guard.configure(max_tokens=1)
    spans.clear()
    loop = tree()

    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 1 model tokens \(max_tokens 1\)"):
        loop.run()

    assert len(loop.planner_model.requests) == 1
    assert loop.budget_model.requests == []  # the tool hop that would run budget was refused
    (refused,) = [s for s in guard_spans(spans) if s.name == "execute_tool ask_budget"]
    assert refused.attributes is not None
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.budget.exhausted"] == "tokens"


def test_an_llm_shared_by_two_agents_counts_each_token_once(instrumented: Any) -> None:
    def shared_tree() -> tuple[Loop, ScriptedLLM]:
        loop = tree()
        loop.budget.llm = loop.planner_model  # budget answers with the planner's model object
        return loop, loop.planner_model

    otel_guard.configure(max_tokens=10**6)
    loop, shared = shared_tree()
    loop.run()
    *before_last, _last = shared.usages
    spent_before_last = sum(before_last)
    assert len(before_last) == 2  # planner's tool call, budget's answer (same object), then planner's
    # The tree must have counted exactly what was spent before the last request: one token more in
    # the budget lets it through, none more stops it.
    otel_guard.configure(max_tokens=spent_before_last + 1)
    assert shared_tree()[0].run().startswith("planner answers after ask_budget")
    otel_guard.configure(max_tokens=spent_before_last)
    with pytest.raises(TreeBudgetExceeded, match="has spent its"):
        shared_tree()[0].run()


def test_tokens_an_llm_spent_before_the_tree_began_are_not_the_tree_s(instrumented: Any) -> None:
    loop = tree(max_tool_calls=2)
    loop.run()  # no model budget on: nothing is read, nothing counted
    spent_before_last = loop.planner_model.usages[0] + loop.budget_model.usages[0]
    # The same agents, the same run again, in a tree allowed just what the run spends before its
    # last request: the model objects' earlier totals are not this tree's.
    otel_guard.configure(max_tokens=spent_before_last + 1)

    assert loop.run().startswith("planner answers after ask_budget")
    assert len(loop.planner_model.usages) == 4


def test_observe_mode_lets_the_request_through_and_records_a_would_refuse(
    instrumented: Any, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    loop = tree()

    assert loop.run().startswith("planner answers after ask_budget")

    # Planner's first request is the tree's one; budget's run (a hop) and the two requests after it
    # would have been refused.
    assert_observe_mode_recorded_the_spent_requests(spans)
