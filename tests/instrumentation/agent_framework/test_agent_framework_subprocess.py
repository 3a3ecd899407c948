"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``agent_framework_loop.py`` is an ordinary Agent Framework program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. Spans (Agent Framework's own and the
guard's) go to the console exporter, and the program prints one ``RESULT {json}`` line of what its
models saw.
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

APP = Path(__file__).with_name("agent_framework_loop.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(*args: str, **guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    return run_instrumented(APP, *args, service="agent-framework-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent")

    assert result["planner_runs"] == 1
    assert result["tool_calls"] == 2
    assert result["tool_bodies"] == {"ask_budget": 1, "ask_planner": 1}
    # The refusal's own text reached the budget model as the tool's result, and the run completed.
    (text,) = result["budget_saw"]
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle)")
    assert "planner → ask_budget → budget → ask_planner" in text
    assert result["output"].startswith("planner answers after budget answers after Refused by otel-guard")

    assert_planner_refused(spans)
    # Agent Framework's own spans are there too, in the same trace, each under the guard's hop of
    # the same call.
    by_id = {s["context"]["span_id"]: s for s in spans}
    theirs = [s for s in spans if s not in hops(spans)]
    assert {s["name"] for s in theirs} >= {"invoke_agent planner", "execute_tool ask_budget"}
    for hop in hops(spans):
        if hop["attributes"]["otel_guard.decision"] == "allow":
            assert any(
                s["parent_id"] == hop["context"]["span_id"] and s["name"] == hop["name"] for s in theirs
            )
    assert all(s["parent_id"] is None or s["parent_id"] in by_id for s in spans)
    assert len({s["context"]["trace_id"] for s in spans}) == 1


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe")

    # Let through: the scripted models bounded the loop (six tool calls in all).
    assert result["planner_runs"] == 4
    assert result["tool_calls"] == 6
    assert not any(text.startswith("Refused") for text in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)


def test_a_ping_pong_of_handoffs_is_stopped_under_opentelemetry_instrument() -> None:
    result, spans = run_app("handoffs", OTEL_GUARD_MAX_NAME_DEPTH="2")

    # Handoffs are transfers, so the hand-back to planner was taken; budget's next one, which would
    # make planner stand a third time, was refused and not taken: budget's model read why as the
    # handoff call's result and answered, and the workflow's run ended asking the user.
    assert result["handoffs"] == [["planner", "budget"], ["budget", "planner"], ["planner", "budget"]]
    assert result["tool_calls"] == 4
    (text,) = result["budget_saw"]
    assert text.startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 2 times in chain planner ⇒ budget ⇒ planner ⇒ budget"
    )
    assert result["answers"] == [f"budget answers after {text}"]
    assert result["asks_the_user"] is True
    refused = [s for s in hops(spans) if s["attributes"]["otel_guard.decision"] == "refuse"]
    assert [(s["name"], s["attributes"]["otel_guard.reason"]) for s in refused] == [
        ("invoke_agent planner", "name_depth")
    ]
    kinds = [s["attributes"]["otel_guard.hop.kind"] for s in hops(spans)]
    assert sorted(kinds) == ["call"] + ["transfer"] * 4
    assert len({s["context"]["trace_id"] for s in hops(spans)}) == 1
