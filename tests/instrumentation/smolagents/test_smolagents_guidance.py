"""Situational guidance in smolagents: an agent that can call an agent on its call path is told so,
at the start of its task (the run's user turn), and what the model receives shows it.

Planner manages budget, which manages a second planner (``managed_loop``): budget, called by planner,
can call ``planner``, an agent on its path ``planner → budget``; planner, at the top, can call only
``budget``, which is not on its path.
"""

from __future__ import annotations

import pytest
from instrumentors import instrumentor_fixture
from smolagents.models import MessageRole
from smolagents_loop import ScriptedModel, managed_loop

import otel_guard
from otel_guard.instrumentation.smolagents import SmolagentsInstrumentor
from otel_guard.prompt import situational_prefix

instrumented = instrumentor_fixture(SmolagentsInstrumentor)


def user_turn(model: ScriptedModel) -> str:
    """The text of the user message the model received first."""
    (text,) = [text for role, text in model.requests[0].messages if role == MessageRole.USER]
    return text


def system_prompt(model: ScriptedModel) -> str:
    (text,) = [text for role, text in model.requests[0].messages if role == MessageRole.SYSTEM]
    return text


def test_an_agent_that_can_call_back_along_its_path_is_told_at_the_start_of_its_task(
    instrumented: SmolagentsInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = managed_loop(max_tool_calls=1)
    planner_model, budget_model = loop.models[:2]

    loop.planner.run("Plan the team offsite")

    # Budget's model received the guidance first in its task, naming the path and planner, before
    # the task smolagents writes for a managed agent.
    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert "do NOT call `planner`" in expected
    assert user_turn(budget_model).startswith(
        f"New task:\n{expected}\n\nYou're a helpful agent named 'budget'"
    )
    # Never in the system prompt.
    assert "[Execution context]" not in system_prompt(budget_model)
    # Planner's only managed agent (budget) is not on its path: no guidance.
    assert user_turn(planner_model) == "New task:\nPlan the team offsite"


@pytest.mark.parametrize("situational_prompt", [False, True])
def test_no_guidance_when_off_or_when_nothing_callable_is_on_the_path(
    instrumented: SmolagentsInstrumentor, situational_prompt: bool
) -> None:
    otel_guard.configure(situational_prompt=situational_prompt)
    loop = managed_loop(max_tool_calls=1)
    budget_model = loop.models[1]

    if situational_prompt:
        # On, but budget runs on its own: its path is just `budget`, and it cannot call budget.
        loop.planner.managed_agents["budget"].run(task="price the offsite")
        assert user_turn(budget_model) == "New task:\nprice the offsite"
    else:
        loop.planner.run("Plan the team offsite")
        assert "[Execution context]" not in user_turn(budget_model)
