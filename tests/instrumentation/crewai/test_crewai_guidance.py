"""Situational guidance in CrewAI: an agent that can reach an agent on its call path is told so at
the start of its user turn, and the model sees it there (the offline model records what it is sent).
"""

from __future__ import annotations

from typing import Any

from crewai_app import ScriptedLLM, agent, build_crew, build_loop

import otel_guard
from otel_guard.prompt import situational_prefix

MARK = "[Execution context]"


def user_turn(request: list[dict[str, Any]]) -> str:
    (user,) = [m for m in request if m["role"] == "user"][:1]
    return str(user["content"])


def system_prompt(request: list[dict[str, Any]]) -> str:
    return " ".join(str(m["content"]) for m in request if m["role"] == "system")


def test_a_coworker_that_can_delegate_back_is_told_its_path(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = build_crew(max_tool_calls=1)

    loop.run()

    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert "path planner → budget" in expected
    first = loop.budget_model.requests[0]
    assert user_turn(first).startswith(expected + "\n\n")
    assert MARK not in system_prompt(first)  # the role, goal and backstory are left alone
    # The planner's tools reach only budget, who is not on the planner's path: no guidance.
    assert not any(MARK in str(m["content"]) for request in loop.planner_model.requests for m in request)


def test_the_guidance_leads_the_user_turn_once_for_the_whole_run(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = build_crew(max_tool_calls=2)

    loop.run()

    later = loop.budget_model.requests[-1]
    assert later[-1]["role"] == "tool"  # a later request of the same run, after its tool call
    assert sum(str(m["content"]).count(MARK) for m in later) == 1
    assert user_turn(later).startswith(MARK)


def test_a_tool_named_like_an_agent_on_the_path_brings_the_guidance(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = build_loop(planner_tool="budget", budget_tool="planner", max_tool_calls=1)

    loop.run()

    # The budget agent's one tool, `planner`, is named like the planner on its path.
    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert user_turn(loop.budget_model.requests[0]).startswith(expected + "\n\n")


def test_a_run_with_no_such_tool_gets_none(instrumented: Any) -> None:
    otel_guard.configure(situational_prompt=True)
    # ask_planner is not named like the planner: the budget agent cannot tell it leads back.
    loop = build_loop(max_tool_calls=1)
    solo_model = ScriptedLLM(model="scripted", agent="solo", max_tool_calls=0)

    loop.run()
    agent("solo", solo_model, []).kickoff("alone")

    for model in (loop.planner_model, loop.budget_model, solo_model):
        assert not any(MARK in str(m["content"]) for request in model.requests for m in request)


def test_without_the_setting_no_guidance_is_added(instrumented: Any) -> None:
    loop = build_crew(max_tool_calls=1)

    loop.run()

    assert not any(MARK in str(m["content"]) for request in loop.budget_model.requests for m in request)
