"""A tree's model requests and tokens in DSPy: counted over the tree's every run, and a budget refusal
deep in a module used as a tool ends the root run with the refusal.

Planner asks budget through a tool; budget answers at once (its model has no tool to call). The
tree's model requests: planner's step (the tool call), budget's step and extract, planner's step
(finish) and extract: five, in two runs. Each scripted response reports 10 tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from dspy_loop import CallBudget, ScriptedLM, build_loop, react
from instrumentors import instrumentor_fixture
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otel_guard
from otel_guard.instrumentation.dspy import DSPyInstrumentor
from otel_guard.instrumentation.dspy._usage import TreeBudgetExceeded
from tests.hop_spans import hop_named


def one_call() -> Any:
    loop = build_loop(calls=1)
    return loop, loop.planner()


instrumented = instrumentor_fixture(DSPyInstrumentor)


def test_a_tree_that_made_its_model_requests_ends_the_run_with_the_refusal(
    instrumented: DSPyInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=3)
    loop, planner = one_call()

    with pytest.raises(TreeBudgetExceeded, match=r"has made its 3 model requests \(max_model_requests 3\)"):
        planner(question="plan the offsite")

    # Planner's tool call and budget's two requests were made; the rest of the tree's were not sent.
    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (1, 2)
    assert loop.planner_lm.observations == []  # its next step was never answered
    events = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert events
    assert events[0].attributes is not None
    assert events[0].attributes["otel_guard.budget.exhausted"] == "model_requests"


def test_with_room_for_them_every_request_is_made(instrumented: DSPyInstrumentor) -> None:
    otel_guard.configure(max_model_requests=5)
    loop, planner = one_call()

    answer = planner(question="plan the offsite").answer

    assert answer == "planner answers after budget answers after Completed."
    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (3, 2)


def test_a_tree_that_spent_its_tokens_makes_no_more_requests(instrumented: DSPyInstrumentor) -> None:
    otel_guard.configure(max_tokens=25)  # 10 tokens a response: the fourth request is refused
    loop, planner = one_call()

    with pytest.raises(TreeBudgetExceeded, match=r"max_tokens 25"):
        planner(question="plan the offsite")

    assert loop.planner_lm.requests + loop.budget_lm.requests == 3


def test_observe_mode_lets_the_requests_through_and_records_would_refuse(
    instrumented: DSPyInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_model_requests=1)
    loop, planner = one_call()

    assert planner(question="plan the offsite").answer.startswith("planner answers after budget answers")

    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (3, 2)
    would = [e for s in spans.all() for e in s.events if e.name == "otel_guard.would_refuse"]
    assert {str((e.attributes or {}).get("otel_guard.budget.exhausted")) for e in would} >= {"model_requests"}


def test_a_hop_budget_refusal_deep_in_a_module_used_as_a_tool_ends_the_root_run_with_it(
    instrumented: DSPyInstrumentor, spans: Any
) -> None:
    # planner (1) -> budget, a module used as planner's tool (2) -> planner again would be the third.
    otel_guard.configure(max_hops=2, cycle_rule="none")
    loop = build_loop(as_tools=True)

    answer = loop.planner()(question="plan the offsite").answer

    # The root run ended with an answer that carries the refusal, made by planner's model.
    (text,) = loop.budget_lm.observations
    assert "reason: budget" in text
    assert "max_hops 2" in text
    assert "budget answers after Execution error in planner:" in answer
    assert "reason: budget" in answer
    assert loop.calls.made == 2


def test_with_the_budgets_off_no_request_is_counted(instrumented: DSPyInstrumentor) -> None:
    lm = ScriptedLM("planner", None, CallBudget(0))
    react("planner", lm, [])(question="offsite")
    assert lm.requests == 2


def test_while_instrumentation_is_suppressed_no_request_is_counted(instrumented: DSPyInstrumentor) -> None:
    # Inside a guarded hop, so that only the suppression keeps the requests from the budget of 1.
    otel_guard.configure(max_model_requests=1)
    loop, planner = one_call()

    with otel_guard.delegate("root"), suppress_instrumentation():
        answer = planner(question="plan the offsite").answer

    assert answer == "planner answers after budget answers after Completed."
    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (3, 2)
