"""The way a user runs it: an unchanged program under ``opentelemetry-instrument``, settings from
the environment only, spans printed by the console exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
APP = HERE / "openai_agents_app.py"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(shape: str, **env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app; return its result line and the spans the console exporter printed."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OPENAI_"))}
    environ.update(
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OPENAI_AGENTS_DISABLE_TRACING="1",
        PYTHONPATH=str(HERE),
        **env,
    )
    done = subprocess.run(
        [str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(APP), shape],
        env=environ,
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stderr.strip().splitlines()[-1])
    return result, _json_objects(done.stdout)


def _json_objects(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    found, index = [], 0
    while (start := text.find("{", index)) != -1:
        value, index = decoder.raw_decode(text, start)
        found.append(value)
    return found


def guard_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in spans if "otel_guard.decision" in s["attributes"]]


def test_loop_of_agents_as_tools_is_stopped_under_opentelemetry_instrument() -> None:
    result, spans = run_app("tools", OTEL_GUARD_CYCLE_RULE="agent")

    assert result["calls"] == 2
    assert result["final_output"].startswith(
        "planner answers: budget answers: Refused by otel-guard (a2a_delegation_cycle, reason: "
        "cycle): Delegation cycle: agent planner is already in chain planner → budget."
    )
    by_name = {(s["name"], s["attributes"]["otel_guard.decision"]): s for s in guard_spans(spans)}
    assert set(by_name) == {
        ("invoke_agent planner", "allow"),
        ("invoke_agent budget", "allow"),
        ("invoke_agent planner", "refuse"),
    }
    refused = by_name["invoke_agent planner", "refuse"]
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert refused["parent_id"] == by_name["invoke_agent budget", "allow"]["context"]["span_id"]


def test_observe_mode_from_the_environment_lets_handoffs_loop() -> None:
    result, spans = run_app(
        "handoffs", OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe", OTEL_GUARD_MAX_NAME_DEPTH="2"
    )

    assert result["calls"] == 6  # only the test model's budget ended the loop
    decisions = [s["attributes"]["otel_guard.decision"] for s in guard_spans(spans)]
    # Handoffs are transfers (a hand-back is no cycle): the places past max_name_depth would be
    # refused, planner's third and fourth and budget's third of seven.
    assert decisions.count("would_refuse") == 3
    assert "refuse" not in decisions
    kinds = [s["attributes"]["otel_guard.hop.kind"] for s in guard_spans(spans)]
    assert kinds.count("transfer") == 6


def test_disabling_the_instrumentation_leaves_the_program_unguarded() -> None:
    result, spans = run_app(
        "tools",
        OTEL_GUARD_CYCLE_RULE="agent",
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="otel_guard_openai_agents",
    )

    assert result["calls"] == 6
    assert "Refused" not in result["final_output"]
    assert guard_spans(spans) == []
