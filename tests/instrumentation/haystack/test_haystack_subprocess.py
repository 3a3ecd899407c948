"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``haystack_loop.py`` is an ordinary Haystack program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. Spans go to the console exporter, and
the program prints one ``RESULT {json}`` line of what its models saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from instrumented_app import assert_observe_mode_let_it_through, assert_planner_refused, run_instrumented

APP = Path(__file__).with_name("haystack_loop.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(**guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    return run_instrumented(APP, service="haystack-app", HAYSTACK_TELEMETRY_ENABLED="False", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app()

    assert (result["planner_runs"], result["budget_runs"], result["tool_calls"]) == (1, 1, 2)
    (text,) = result["budget_saw"]
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle)")
    assert "agent planner is already in chain planner → budget." in text
    assert result["output"].startswith("planner answers after budget answers after Refused")
    assert result["exit_reason"] == "text"

    assert_planner_refused(spans, chain=("planner", "budget", "planner"))
    assert len({s["context"]["trace_id"] for s in spans}) == 1


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_MODE="observe")

    assert result["tool_calls"] == 6  # let through: the scripts bounded the loop
    assert all(not text.startswith("Refused") for text in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)
