"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``pydantic_ai_app.py`` is an ordinary pydantic-ai program with no otel-guard code in it; the
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

APP = Path(__file__).with_name("pydantic_ai_app.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(*args: str, **guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    return run_instrumented(APP, *args, service="pydantic-ai-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app("--pydantic-ai-spans", OTEL_GUARD_CYCLE_RULE="agent")

    assert result["planner_runs"] == 1
    assert result["tool_bodies"] == {"ask_budget": 1, "ask_planner": 1}
    ((outcome, text),) = result["budget_saw"]
    assert outcome == "failed"
    assert "reason: cycle" in text
    assert "planner → ask_budget → budget → ask_planner" in text
    assert result["output"] == "planner answers after ask_budget success"

    assert_planner_refused(spans)
    # pydantic-ai's own spans (Instrumentation capability) hang under our hop spans in one trace.
    by_id = {s["context"]["span_id"]: s for s in spans}
    for hop in hops(spans):
        if hop["attributes"]["otel_guard.decision"] == "allow":
            children = [s for s in spans if s["parent_id"] == hop["context"]["span_id"]]
            assert [c["name"] for c in children if c["name"] == hop["name"]] == [hop["name"]]
    assert len({s["context"]["trace_id"] for s in by_id.values()}) == 1


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe")

    # Let through: the scripted models bounded the loop (three tool calls each).
    assert result["planner_runs"] == 4
    assert all(outcome == "success" for outcome, _text in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)
