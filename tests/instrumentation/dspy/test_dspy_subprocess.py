"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``dspy_loop.py`` is an ordinary DSPy program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. Spans go to the console exporter, and
the program prints one ``RESULT {json}`` line of what happened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from instrumented_app import assert_observe_mode_let_it_through, assert_planner_refused, run_instrumented

APP = Path(__file__).with_name("dspy_loop.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(**guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return run_instrumented(APP, service="dspy-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app()

    assert result["error"] is None
    assert result["calls"] == 2
    assert result["tool_bodies"] == {"ask_budget": 1, "ask_planner": 1}
    assert result["answer"].startswith(
        "planner answers after budget answers after Execution error in ask_planner"
    )
    assert "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)" in result["answer"]
    assert_planner_refused(spans)
    assert len({s["context"]["trace_id"] for s in spans}) == 1


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_MODE="observe")

    assert result["calls"] == 6  # let through: the scripted models bounded the loop
    assert "Refused" not in result["answer"]
    assert_observe_mode_let_it_through(spans)
