"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``crewai_app.py`` is an ordinary CrewAI program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. Spans go to the console exporter, and
the program prints one ``RESULT {json}`` line of what its models saw and whether anything in it tried
to reach another host.
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

APP = Path(__file__).with_name("crewai_app.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(*args: str, **guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    result, spans = run_instrumented(APP, *args, service="crewai-app", **guard_env)
    assert result["external_connections"] == []
    return result, spans


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app()

    assert result["planner_runs"] == 1
    assert result["tool_bodies"] == {"ask_budget": 1, "ask_planner": 1}
    (seen,) = result["budget_saw"]
    assert "reason: cycle" in seen
    assert "planner → ask_budget → budget → ask_planner" in seen
    assert result["output"].startswith("planner answers after ask_budget: budget answers after ask_planner")

    assert_planner_refused(spans)
    assert len({s["context"]["trace_id"] for s in hops(spans)}) == 1


def test_a_crew_s_delegation_back_is_refused_under_opentelemetry_instrument() -> None:
    result, spans = run_app("crew")

    assert (result["planner_runs"], result["budget_runs"]) == (1, 1)
    (seen,) = result["budget_saw"]
    assert "agent planner is already in chain planner → budget" in seen
    assert [(s["name"], s["attributes"]["otel_guard.decision"]) for s in hops(spans)] == [
        ("invoke_agent planner", "refuse"),  # the console exporter writes a span when it ends
        ("invoke_agent budget", "allow"),
        ("invoke_agent planner", "allow"),
    ]


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe")

    # Let through: the scripted models bounded the loop (three tool calls each).
    assert (result["planner_runs"], result["budget_runs"]) == (4, 3)
    assert not any("Refused" in seen for seen in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)
