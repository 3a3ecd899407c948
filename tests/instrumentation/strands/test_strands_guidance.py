"""Situational guidance in Strands: an agent that can call an agent on its call path is told so,
at the start of its user turn, and what the model receives shows it.

Planner and budget are each other's tool (Strands' ``agent.as_tool()``): budget, called by planner,
sees a ``planner`` tool, an agent on its path ``planner → budget``; planner, at the top, sees only
``budget``, which is not on its path.
"""

from __future__ import annotations

from typing import Any

import pytest
from strands import Agent
from strands_loop import CallBudget, ScriptedModel
from strands_support import instrumented_fixture

import otel_guard
from otel_guard.instrumentation.strands import StrandsInstrumentor
from otel_guard.prompt import situational_prefix

instrumented = instrumented_fixture()


def planner_and_budget() -> tuple[Agent, ScriptedModel, ScriptedModel]:
    """Planner calls budget once; budget answers without calling planner back."""
    calls = CallBudget(1)
    planner_model = ScriptedModel("planner", "budget", calls, tool_input={"input": "price the offsite"})
    budget_model = ScriptedModel("budget", "planner", calls, tool_input={"input": "what is the plan?"})
    planner = Agent(name="planner", model=planner_model, system_prompt="You plan.", callback_handler=None)
    budget = Agent(
        name="budget",
        model=budget_model,
        system_prompt="You price plans.",
        tools=[planner.as_tool(description="Ask the planner for the plan.")],
        callback_handler=None,
    )
    planner.tool_registry.register_tool(budget.as_tool(description="Ask the budget agent for a price."))
    return planner, planner_model, budget_model


def user_turn(model: ScriptedModel) -> list[dict[str, Any]]:
    """The content of the user message the model received first."""
    first = model.requests[0].messages
    (message,) = [m for m in first if m["role"] == "user"]
    return list(message["content"])


async def test_an_agent_that_can_call_back_along_its_path_is_told_at_the_start_of_its_user_turn(
    instrumented: StrandsInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    planner, planner_model, budget_model = planner_and_budget()

    await planner.invoke_async("Plan the team offsite")

    # Budget's model received the guidance first in its user turn, naming the path and planner.
    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert "planner → budget" in expected
    assert "do NOT call `planner`" in expected
    assert user_turn(budget_model) == [{"text": expected}, {"text": "price the offsite"}]
    # Never in the system prompt: the shared, cached prefix stays the same.
    assert budget_model.requests[0].system_prompt == "You price plans."
    # Planner's only agent tool (budget) is not on its path: no guidance.
    assert user_turn(planner_model) == [{"text": "Plan the team offsite"}]


@pytest.mark.parametrize("situational_prompt", [False, True])
async def test_no_guidance_when_off_or_when_no_tool_is_on_the_path(
    instrumented: StrandsInstrumentor, situational_prompt: bool
) -> None:
    otel_guard.configure(situational_prompt=situational_prompt)
    planner, planner_model, budget_model = planner_and_budget()

    if situational_prompt:
        # On, but budget runs on its own: its path is just `budget`, and it has no budget tool.
        await planner.tool_registry.registry["budget"].agent.invoke_async("price the offsite")
        assert user_turn(budget_model) == [{"text": "price the offsite"}]
    else:
        await planner.invoke_async("Plan the team offsite")
        assert user_turn(budget_model) == [{"text": "price the offsite"}]
    assert all(
        request.system_prompt in ("You plan.", "You price plans.")
        for request in (*planner_model.requests, *budget_model.requests)
    )
