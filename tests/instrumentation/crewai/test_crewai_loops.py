"""CrewAI under otel-guard: a planner ⇄ budget loop ends at its first bounce, and the model answers.

Real CrewAI agents and crews, driven by the offline :class:`crewai_app.ScriptedLLM`; spans and
metrics go to the session's in-memory SDK (tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from crewai_app import build_crew, build_loop

import otel_guard
from tests.hop_spans import assert_observe_mode_recorded_the_loop, decisions, guard_spans, refused

PATH = "planner → ask_budget → budget → ask_planner"


def assert_is_the_refusal(text: str, path: str) -> None:
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle)")
    assert f"agent planner is already in chain {path}" in text
    assert "do not call it again" in text


# -- a tool that runs the other agent (kickoff) -------------------------------------------------


def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    output = loop.run()

    # The bounce budget -> planner was refused inside ask_planner's body: the planner ran once, the
    # budget model read the refusal as its tool's result, and both answered.
    assert (loop.planner_model.runs, loop.budget_model.runs) == (1, 1)
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    (seen,) = loop.budget_model.tool_results
    assert_is_the_refusal(seen, PATH)
    assert output.startswith("planner answers after ask_budget: budget answers after ask_planner: Refused")
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]
    # The tool whose body ran the refused agent records the refusal as its error.
    tool = next(s for s in guard_spans(spans) if s.name == "execute_tool ask_planner")
    assert tool.status.status_code.name == "ERROR"
    assert tool.attributes is not None
    assert tool.attributes["error.type"] == "DelegationRefused"


def test_the_default_rule_stops_the_loop_at_the_same_bounce(instrumented: Any, spans: Any) -> None:
    loop = build_loop()

    loop.run()

    assert loop.planner_model.runs == 1
    assert decisions(spans)[-1] == (
        "invoke_agent planner",
        "refuse",
        ("planner", "ask_budget", "budget", "ask_planner", "planner"),
    )


def test_a_tool_named_like_its_agent_is_one_hop_and_is_refused_before_its_body(
    instrumented: Any, spans: Any
) -> None:
    # Tools named after the agent they run: calling tool `budget` is the delegation to agent budget.
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    loop.run()

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    # CrewAI's before_tool_call hook blocked the call: its body never ran, the model read the refusal.
    assert loop.tool_bodies == {"budget": 1}
    (seen,) = loop.budget_model.tool_results
    assert_is_the_refusal(seen, "planner → budget")
    assert "blocked by hook" not in seen


def test_a_tool_that_handles_the_refusal_of_the_agent_it_ran_keeps_its_answer(
    instrumented: Any, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()
    ask_planner = loop.budget.tools[0]
    ask_planner.answer_when_refused = "the plan I have: three days in Lisbon"  # type: ignore[attr-defined]

    loop.run()

    assert loop.budget_model.tool_results == ["the plan I have: three days in Lisbon"]
    assert len(refused(spans)) == 1  # the planner's run inside the tool was refused all the same
    tool = next(s for s in guard_spans(spans) if s.name == "execute_tool ask_planner")
    assert tool.status.status_code.name == "UNSET"


def test_the_text_action_format_gets_the_refusal_once(instrumented: Any, spans: Any) -> None:
    # Without native function calling CrewAI parses "Action:" text, and retries a tool whose body
    # failed: every attempt is refused, one refused span records it, the model reads the refusal.
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(native=False)

    output = loop.run()

    assert loop.planner_model.runs == 1
    assert loop.tool_bodies["ask_budget"] == 1
    assert loop.tool_bodies["ask_planner"] > 1  # CrewAI's own retries of a failing tool
    assert len(refused(spans)) == 1
    (seen,) = loop.budget_model.tool_results
    assert_is_the_refusal(seen, PATH)
    assert "planner answers after ask_budget" in output


def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: Any, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe", max_depth=32, max_name_depth=32)
    loop = build_loop(max_tool_calls=2)

    loop.run()

    # Nothing refused: the scripted models bound the bouncing (two tool calls each).
    assert (loop.planner_model.runs, loop.budget_model.runs) == (3, 2)
    assert loop.tool_bodies == {"ask_budget": 2, "ask_planner": 2}
    assert not any("Refused" in seen for seen in loop.budget_model.tool_results)
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


# -- CrewAI's delegation tools ------------------------------------------------------------------


def test_a_delegation_back_to_an_agent_on_the_path_is_refused_before_it_runs(
    instrumented: Any, spans: Any
) -> None:
    loop = build_crew()

    output = loop.run()

    # planner's task delegated to budget (one hop: the delegation is the coworker's run); budget's
    # delegation back to planner was refused by the before_tool_call hook, so CrewAI never tried to
    # run the planner again ("Executor is already running" without the guard).
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert (loop.planner_model.runs, loop.budget_model.runs) == (1, 1)
    (seen,) = loop.budget_model.tool_results
    assert_is_the_refusal(seen, "planner → budget")
    assert output.startswith("planner answers after delegate_work_to_coworker: budget answers after")


def test_asking_a_coworker_a_question_is_a_hop_into_that_coworker(instrumented: Any, spans: Any) -> None:
    loop = build_crew(max_tool_calls=1)
    loop.planner_model.tool = "ask_question_to_coworker"
    loop.planner_model.arguments = {
        "question": "what does it cost?",
        "context": "offsite",
        "coworker": "budget",
    }

    loop.run()

    assert decisions(spans)[:2] == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
    ]
    assert loop.budget_model.runs == 1


def test_a_delegation_names_the_coworker_as_crewai_finds_it(instrumented: Any, spans: Any) -> None:
    # Roles with capitals and spaces; the models name the coworker in lower case, as models do.
    loop = build_crew(planner_role="Trip  Planner", budget_role="Budget Analyst")
    loop.planner_model.arguments["coworker"] = "budget analyst"
    loop.budget_model.arguments["coworker"] = "trip planner"

    loop.run()

    assert decisions(spans) == [
        ("invoke_agent Trip Planner", "allow", ("Trip Planner",)),
        ("invoke_agent Budget Analyst", "allow", ("Trip Planner", "Budget Analyst")),
        ("invoke_agent Trip Planner", "refuse", ("Trip Planner", "Budget Analyst", "Trip Planner")),
    ]


def test_a_delegation_to_an_unknown_coworker_is_a_tool_call(instrumented: Any, spans: Any) -> None:
    loop = build_crew(max_tool_calls=1)
    loop.planner_model.arguments["coworker"] = "accountant"

    loop.run()

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool delegate_work_to_coworker", "allow", ("planner", "delegate_work_to_coworker")),
    ]
    assert loop.budget_model.requests == []
    assert "coworker mentioned not found" in loop.planner_model.tool_results[0]  # CrewAI's own answer


@pytest.mark.parametrize("native", [True, False])
def test_without_the_guard_the_loop_bounces_until_the_scripts_give_up(native: bool, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(max_tool_calls=2, native=native)

    loop.run()

    assert (loop.planner_model.runs, loop.budget_model.runs) == (3, 2)
    assert guard_spans(spans) == []
