"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``strands_loop.py`` is an ordinary Strands program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. Spans (Strands' own and the guard's)
go to the console exporter, and the program prints one ``RESULT {json}`` line of what its models saw.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from instrumented_app import (
    assert_observe_mode_let_it_through,
    assert_planner_refused,
    hops,
    run_instrumented,
)

APP = Path(__file__).with_name("strands_loop.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(**guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    return run_instrumented(APP, service="strands-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent")

    assert result["planner_runs"] == 1
    assert result["tool_calls"] == 2
    assert result["tool_bodies"] == {"ask_budget": 1, "ask_planner": 1}
    ((status, text),) = result["budget_saw"]
    assert status == "error"
    assert "reason: cycle" in text
    assert "planner → ask_budget → budget → ask_planner" in text
    assert result["output"].startswith("planner answers after success: budget answers after error: Refused")

    assert_planner_refused(spans)
    # Strands' own spans are there too, each hop's parent being Strands' span of the same call.
    by_id = {s["context"]["span_id"]: s for s in spans}
    for hop in hops(spans):
        assert by_id[hop["parent_id"]]["name"] == hop["name"]
    assert len({s["context"]["trace_id"] for s in spans}) == 1


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe")

    # Let through: the scripted models bounded the loop (six tool calls in all).
    assert result["planner_runs"] == 4
    assert result["tool_calls"] == 6
    assert all(status == "success" for status, _text in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)


def test_a_bad_setting_stops_the_program_at_start_up_in_one_line() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "PYTHONPATH"))}
    env |= {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    env["OTEL_GUARD_MODE"] = "sometimes"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("opentelemetry-instrument")), sys.executable, str(APP)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 2
    assert "RESULT" not in done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("otel-guard: ")
    assert "OTEL_GUARD_MODE" in line
