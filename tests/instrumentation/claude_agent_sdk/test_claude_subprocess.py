"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``claude_loop.py`` is an ordinary Claude Agent SDK program with no otel-guard code in it (it starts
its scripted Messages API on 127.0.0.1 and stops it); the ``opentelemetry_instrumentor`` entry point
installs the guard. Spans go to the console exporter, and the program prints one ``RESULT {json}``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from instrumented_app import assert_observe_mode_let_it_through, hops, run_instrumented

APP = Path(__file__).with_name("claude_loop.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(**guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return run_instrumented(APP, service="claude-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app()

    assert (result["planner_runs"], result["budget_runs"], result["tool_calls"]) == (1, 1, 2)
    (text,) = result["budget_saw"]
    assert "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)" in text
    assert "agent planner is already in chain planner → budget." in text
    (refused,) = [s for s in hops(spans) if s["attributes"]["otel_guard.decision"] == "refuse"]
    assert refused["name"] == "execute_tool planner"
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert len({s["context"]["trace_id"] for s in spans}) == 1


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_MODE="observe", OTEL_GUARD_CYCLE_RULE="agent", LOOP_MAX_TOOL_CALLS="3")

    assert result["tool_calls"] == 3  # let through: the scripts bounded the loop
    assert_observe_mode_let_it_through(spans)
