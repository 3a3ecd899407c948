"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``google_adk_app.py`` is an ordinary ADK program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. Spans go to the console exporter, and
the program prints one ``RESULT {json}`` line of what its models saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from instrumented_app import (
    assert_observe_mode_let_it_through,
    assert_planner_refused,
    hops,
    run_instrumented,
)

APP = Path(__file__).with_name("google_adk_app.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(*args: str, **guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    return run_instrumented(APP, *args, service="google-adk-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent")

    assert result["tool_calls"] == 2
    assert result["planner_requests"] == 2
    (error,) = result["budget_errors"]
    assert "reason: cycle" in error
    assert "planner → budget" in error
    assert result["answer"] == "planner answers after budget ok"
    assert_planner_refused(spans, ("planner", "budget", "planner"))
    assert_one_trace_with_adks_spans_inside(spans, "execute_tool budget")


def test_a_ping_pong_of_transfers_is_stopped_at_max_name_depth_under_opentelemetry_instrument() -> None:
    result, spans = run_app("--transfer", OTEL_GUARD_MAX_NAME_DEPTH="2")

    # planner => budget => planner => budget: the hand-backs are allowed (transfers), the fourth
    # transfer would make planner stand a third time. Budget stays in charge and answers.
    assert result["tool_calls"] == 4
    assert result["planner_requests"] == 2
    (error,) = result["budget_errors"]
    assert "reason: name_depth" in error
    assert "chain planner ⇒ budget ⇒ planner ⇒ budget;" in error
    assert result["answer"] == "budget answers after transfer_to_agent error"
    decided = [
        (s["name"], s["attributes"]["otel_guard.decision"], s["attributes"]["otel_guard.hop.kind"])
        for s in sorted(hops(spans), key=lambda s: s["start_time"])
    ]
    assert decided == [
        ("invoke_agent planner", "allow", "call"),
        ("invoke_agent budget", "allow", "transfer"),
        ("invoke_agent planner", "allow", "transfer"),
        ("invoke_agent budget", "allow", "transfer"),
        ("invoke_agent planner", "refuse", "transfer"),
    ]
    assert_one_trace_with_adks_spans_inside(spans, "execute_tool transfer_to_agent")


def assert_one_trace_with_adks_spans_inside(spans: list[dict[str, Any]], call: str) -> None:
    """ADK's own spans of the calls nest under the guard's hops, in one trace; the (first) hop into
    budget is a child of ADK's span ``call`` of the call that asked for it."""
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    by_id = {s["context"]["span_id"]: s for s in spans}
    budget_hop = min(
        (s for s in hops(spans) if s["name"] == "invoke_agent budget"), key=lambda s: s["start_time"]
    )
    inside = [s["name"] for s in spans if s["parent_id"] == budget_hop["context"]["span_id"]]
    assert "invoke_agent budget" in inside or "invoke_workflow budget" in inside, inside
    assert by_id[budget_hop["parent_id"]]["name"] == call


def test_observe_mode_and_guidance_from_the_environment() -> None:
    result, spans = run_app(
        OTEL_GUARD_MODE="observe", OTEL_GUARD_MAX_DEPTH="32", OTEL_GUARD_SITUATIONAL_PROMPT="true"
    )

    assert result["tool_calls"] == 6  # let through: the scripts bounded the loop
    assert result["budget_errors"] == []
    assert_observe_mode_let_it_through(spans)
    assert result["budget_first_user_text"].startswith("[Execution context] You are currently running INSIDE")
