"""Situational guidance in Agent Framework: an agent that can call an agent on its call path is told
so, at the start of its user turn, and what the model receives shows it.

Planner and budget are each other's tool (Agent Framework's ``agent.as_tool()``): budget, called by
planner, sees a ``planner`` tool, an agent on its path ``planner → budget``; planner, at the top, sees
only ``budget``, which is not on its path.
"""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import Agent
from agent_framework_loop import CallBudget, ScriptedClient
from agent_framework_support import instrumented_fixture

import otel_guard
from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor
from otel_guard.prompt import situational_prefix

instrumented = instrumented_fixture()


def planner_and_budget() -> tuple[Agent[Any], Agent[Any], ScriptedClient, ScriptedClient]:
    """Planner calls budget once; budget answers without calling planner back."""
    calls = CallBudget(1)
    planner_client = ScriptedClient("planner", "budget", calls, tool_input={"task": "price the offsite"})
    budget_client = ScriptedClient("budget", "planner", calls, tool_input={"task": "what is the plan?"})
    planner = Agent(client=planner_client, name="planner", instructions="You plan.")
    budget = Agent(
        client=budget_client,
        name="budget",
        instructions="You price plans.",
        tools=[planner.as_tool(description="Ask the planner for the plan.")],
    )
    planner.default_options["tools"].append(budget.as_tool(description="Ask the budget agent for a price."))
    return planner, budget, planner_client, budget_client


def user_turn(client: ScriptedClient) -> list[str]:
    """The text contents of the user message the model received first."""
    (contents,) = [texts for role, texts in client.requests[0].messages if role == "user"]
    return contents


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_an_agent_that_can_call_back_along_its_path_is_told_at_the_start_of_its_user_turn(
    instrumented: AgentFrameworkInstrumentor, streamed: bool
) -> None:
    otel_guard.configure(situational_prompt=True)
    planner, _budget, planner_client, budget_client = planner_and_budget()

    if streamed:
        async for _update in planner.run("Plan the team offsite", stream=True):
            pass
    else:
        await planner.run("Plan the team offsite")

    # Budget's model received the guidance first in its user turn, naming the path and planner.
    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert "planner → budget" in expected
    assert "do NOT call `planner`" in expected
    assert user_turn(budget_client) == [expected, "price the offsite"]
    # Never in the instructions (the system prompt): the shared, cached prefix stays the same.
    assert budget_client.requests[0].instructions == "You price plans."
    assert [role for role, _texts in budget_client.requests[0].messages] == ["user"]
    # Planner's only agent tool (budget) is not on its path: no guidance.
    assert user_turn(planner_client) == ["Plan the team offsite"]


@pytest.mark.parametrize("situational_prompt", [False, True])
async def test_no_guidance_when_off_or_when_no_tool_is_on_the_path(
    instrumented: AgentFrameworkInstrumentor, situational_prompt: bool
) -> None:
    otel_guard.configure(situational_prompt=situational_prompt)
    planner, budget, _planner_client, budget_client = planner_and_budget()

    if situational_prompt:
        # On, but budget runs on its own: its path is just `budget`, and it has no budget tool.
        await budget.run("price the offsite")
    else:
        await planner.run("Plan the team offsite")
    assert user_turn(budget_client) == ["price the offsite"]
