"""A tree's model requests and tokens in Agno: counted over the tree's every run, and a budget refusal
deep in a sub-agent or a team member ends the root run with the refusal in its result.

Planner asks budget through a tool; budget answers at once. The tree's model requests: planner's
first (the tool call), budget's one, planner's answer: three, in two runs. Each scripted response
reports 10 tokens in Agno's ``Metrics``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agno_loop import build_loop, team_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.instrumentation.agno import AgnoInstrumentor
from tests.hop_spans import hop_named

instrumented = instrumentor_fixture(AgnoInstrumentor)

SPENT = "has made its 2 model requests (max_model_requests 2); the model request is refused"


def test_a_tree_that_made_its_model_requests_ends_the_run_with_the_refusal(
    instrumented: AgnoInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = build_loop(calls=1)

    output = loop.planner().run("plan the offsite")

    # Planner's tool call and budget's answer were made; planner's answer, in the same tree, was not.
    assert (loop.planner_model.requests, loop.budget_model.requests) == (1, 1)
    assert str(output.status) == "RunStatus.error"
    assert SPENT in str(output.content)
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


def test_with_room_for_them_every_request_is_made(instrumented: AgnoInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = build_loop(calls=1)

    output = loop.planner().run("plan the offsite")

    assert output.content == "planner answers after budget answers"
    assert (loop.planner_model.requests, loop.budget_model.requests) == (2, 1)


def test_a_tree_that_spent_its_tokens_makes_no_more_requests(instrumented: AgnoInstrumentor) -> None:
    otel_guard.configure(max_tokens=15)  # 10 a response: the third request is refused
    loop = build_loop(calls=1)

    output = loop.planner().run("plan the offsite")

    assert "max_tokens 15" in str(output.content)
    assert (loop.planner_model.requests, loop.budget_model.requests) == (1, 1)


def test_the_async_run_counts_the_same(instrumented: AgnoInstrumentor) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = build_loop(calls=1)
    planner = loop.planner()

    output = asyncio.run(planner.arun("plan the offsite"))

    assert SPENT in str(output.content)


def test_observe_mode_lets_the_requests_through_and_records_would_refuse(
    instrumented: AgnoInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_model_requests=1)
    loop = build_loop(calls=1)

    assert loop.planner().run("plan the offsite").content == "planner answers after budget answers"

    would = [e for s in spans.all() for e in s.events if e.name == "otel_guard.would_refuse"]
    assert "model_requests" in {str((e.attributes or {}).get("otel_guard.budget.exhausted")) for e in would}


def test_a_budget_refusal_deep_in_a_sub_agent_ends_the_root_run_with_it(
    instrumented: AgnoInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=1)
    loop = build_loop(calls=1)

    output = loop.planner().run("plan the offsite")

    # Budget's one request was refused: its tool call answered with the refusal, and planner's next
    # request was refused too. The root run ends, with the refusal, not an empty success.
    assert loop.budget_model.requests == 0
    assert str(output.status) == "RunStatus.error"
    assert "has made its 1 model requests (max_model_requests 1)" in str(output.content)


@pytest.mark.parametrize("mode", ["coordinate", "route"])
def test_a_hop_budget_refusal_deep_in_a_team_member_ends_the_root_run_with_it(
    instrumented: AgnoInstrumentor, mode: str
) -> None:
    # team planner (1) -> member budget (2) -> ask_planner (3): planner's team again is the fourth hop.
    otel_guard.configure(max_hops=3, cycle_rule="none")
    loop = team_loop(mode)

    output = loop.team().run("plan the offsite")

    (text,) = loop.budget_model.tool_results
    assert "reason: budget" in text
    assert "max_hops 3" in text
    assert "reason: budget" in str(output.content)
