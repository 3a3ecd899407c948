"""The way a user runs it: ``opentelemetry-instrument python app.py``, configured by the environment.

``llama_index_loop.py`` is an ordinary LlamaIndex program with no otel-guard code in it; the
``opentelemetry_instrumentor`` entry point installs the guard. The guard's spans go to the console
exporter, and the program prints one ``RESULT {json}`` line of what its models saw.
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

APP = Path(__file__).with_name("llama_index_loop.py")

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run_app(*args: str, **guard_env: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the app under opentelemetry-instrument; its RESULT and the spans it exported."""
    return run_instrumented(APP, *args, service="llama-index-app", **guard_env)


def test_the_loop_is_stopped_and_answered_under_opentelemetry_instrument() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent")

    assert (result["planner_runs"], result["budget_runs"], result["tool_calls"]) == (1, 1, 2)
    assert result["tool_bodies"] == {"ask_budget": 1, "ask_planner": 1}
    (text,) = result["budget_saw"]
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle)")
    assert "agent planner is already in chain planner → budget." in text
    assert result["output"].startswith("planner answers after: budget answers after: Refused")

    # The agents the tools run take the tools' places in the chain.
    assert_planner_refused(spans, ("planner", "budget", "planner"))
    assert len({s["context"]["trace_id"] for s in hops(spans)}) == 1


def test_the_handoffs_are_stopped_under_opentelemetry_instrument() -> None:
    result, spans = run_app("handoffs", OTEL_GUARD_CYCLE_RULE="agent")

    assert result["handoffs"] == 2
    (text,) = result["budget_saw"]
    assert "agent planner is already in chain planner → budget." in text
    assert result["output"].startswith("budget answers after: Refused by otel-guard")
    (refused,) = [s for s in hops(spans) if s["attributes"]["otel_guard.decision"] == "refuse"]
    assert refused["name"] == "invoke_agent planner"
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe")

    # Let through: the scripted models bounded the loop (six tool calls in all).
    assert (result["planner_runs"], result["tool_calls"]) == (4, 6)
    assert not any("Refused" in text for text in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)
