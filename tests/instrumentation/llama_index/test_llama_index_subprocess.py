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


def test_a_ping_pong_of_handoffs_is_stopped_under_opentelemetry_instrument() -> None:
    result, spans = run_app("handoffs", OTEL_GUARD_MAX_NAME_DEPTH="2")

    # Handoffs are transfers, so the hand-back to planner was taken; budget's next one, which would
    # make planner stand a third time, was refused: budget's model read why and answered.
    assert result["handoffs"] == 4
    (text,) = result["budget_saw"]
    assert text.startswith(
        "Refused by otel-guard (a2a_delegation_depth, reason: name_depth): Delegation name depth: agent "
        "planner already stands 2 times in chain planner ⇒ budget ⇒ planner ⇒ budget"
    )
    assert result["output"] == f"budget answers after: {text}"
    (refused,) = [s for s in hops(spans) if s["attributes"]["otel_guard.decision"] == "refuse"]
    assert refused["name"] == "invoke_agent planner"
    assert refused["attributes"]["otel_guard.reason"] == "name_depth"
    assert refused["attributes"]["otel_guard.chain.agents"] == [
        "planner",
        "budget",
        "planner",
        "budget",
        "planner",
    ]
    kinds = [s["attributes"]["otel_guard.hop.kind"] for s in hops(spans)]
    assert sorted(kinds) == ["call"] + ["transfer"] * 4


def test_observe_mode_from_the_environment_records_would_refuse() -> None:
    result, spans = run_app(OTEL_GUARD_CYCLE_RULE="agent", OTEL_GUARD_MODE="observe")

    # Let through: the scripted models bounded the loop (six tool calls in all).
    assert (result["planner_runs"], result["tool_calls"]) == (4, 6)
    assert not any("Refused" in text for text in result["budget_saw"])
    assert_observe_mode_let_it_through(spans)
