"""Situational guidance: an agent that has itself as a tool is told so at the start of its user turn."""

from __future__ import annotations

import openai_agents_helpers  # noqa: F401  (the SDK's tracing off)
from agents import Agent, RunConfig, Runner
from agents.run_config import CallModelData, ModelInputData
from openai_agents_models import (
    CallBudget,
    LoopModel,
    agents_as_tools_of_each_other,
    agents_handing_off_to_each_other,
)

import otel_guard
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)


def self_calling_planner() -> Agent[object]:
    planner = Agent(name="planner", instructions="You plan trips.")
    planner.tools = [planner.as_tool("planner", "Plan a trip, step by step.")]
    planner.model = LoopModel("planner", "planner", CallBudget(3))
    return planner


def user_messages(model: LoopModel) -> list[object]:
    return [
        item["content"]
        for call in model.calls
        for item in call.input
        if isinstance(item, dict) and item.get("role") == "user"
    ]


async def test_guidance_leads_the_user_turn_never_the_instructions(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True, cycle_rule="agent")
    planner = self_calling_planner()

    result = await Runner.run(planner, "Plan a trip to Lisbon.")

    prefix = otel_guard.situational_prefix("planner", "Plan a trip, step by step.")
    assert user_messages(planner.model) == [f"{prefix}\n\nPlan a trip to Lisbon."] * 2
    assert {call.system_instructions for call in planner.model.calls} == {"You plan trips."}
    # Only the model's input carries it: the run's history is the user's own words.
    assert result.to_input_list()[0]["content"] == "Plan a trip to Lisbon."


async def test_guidance_goes_into_the_newest_user_message_after_the_apps_filter(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True, cycle_rule="agent")
    planner = self_calling_planner()
    seen_by_filter: list[object] = []

    def app_filter(data: CallModelData[object]) -> ModelInputData:
        seen_by_filter.append(data.model_data.input[-1])
        return data.model_data

    history = [
        {"role": "user", "content": "Earlier question."},
        {"role": "assistant", "content": "Earlier answer."},
        {"role": "user", "content": [{"type": "input_text", "text": "Plan a trip to Lisbon."}]},
    ]
    await Runner.run(planner, history, run_config=RunConfig(call_model_input_filter=app_filter))

    prefix = otel_guard.situational_prefix("planner", "Plan a trip, step by step.")
    first_call = planner.model.calls[0].input
    assert first_call[0]["content"] == "Earlier question."
    assert first_call[2]["content"] == [
        {"type": "input_text", "text": prefix},
        {"type": "input_text", "text": "Plan a trip to Lisbon."},
    ]
    assert seen_by_filter[0] == history[2]  # the application's filter saw the user's own input


async def test_no_guidance_when_off_or_when_the_agent_cannot_call_itself(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    planner = self_calling_planner()
    await Runner.run(planner, "Plan a trip to Lisbon.")
    assert set(map(str, user_messages(planner.model))) == {"Plan a trip to Lisbon."}

    otel_guard.configure(situational_prompt=True)
    other, _ = agents_as_tools_of_each_other(CallBudget(0))
    await Runner.run(other, "Plan a trip to Lisbon.")
    assert user_messages(other.model) == ["Plan a trip to Lisbon."]


async def test_guidance_in_the_agent_tool_run(instrumentor: OpenAIAgentsInstrumentor) -> None:
    """budget has itself as a tool and runs as planner's tool: its own user turn is prefixed."""
    otel_guard.configure(situational_prompt=True, cycle_rule="agent")
    budget_agent = Agent(name="budget", instructions="Price plans.", handoff_description="Prices.")
    budget_agent.tools = [budget_agent.as_tool("price_again", None)]
    budget_agent.model = LoopModel("budget", None, CallBudget(0))
    planner = Agent(name="planner", tools=[budget_agent.as_tool("budget", "Ask budget.")])
    planner.model = LoopModel("planner", "budget", CallBudget(1))

    await Runner.run(planner, "Plan a trip to Lisbon.")

    prefix = otel_guard.situational_prefix("budget", "Prices.", path=["planner", "budget"])
    assert user_messages(budget_agent.model) == [f"{prefix}\n\nquestion from planner"]
    assert "planner → budget" in prefix
    assert user_messages(planner.model)[0] == "Plan a trip to Lisbon."


async def test_guidance_names_the_path_to_an_agent_that_can_call_its_caller(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    """budget runs as planner's tool and has planner as a tool: it is told the path planner → budget."""
    otel_guard.configure(situational_prompt=True)
    planner, budget_agent = agents_as_tools_of_each_other(CallBudget(1))

    await Runner.run(planner, "Plan a trip to Lisbon.")

    prefix = otel_guard.situational_prefix("budget", "", path=["planner", "budget"])
    assert user_messages(budget_agent.model) == [f"{prefix}\n\nquestion from planner"]
    assert "planner → budget" in prefix
    assert "do NOT call `planner` either" in prefix
    # planner, at the root, sees only budget, which is not on its path (yet).
    assert user_messages(planner.model)[0] == "Plan a trip to Lisbon."


async def test_no_guidance_against_handing_back_across_a_handoff(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    """planner hands off to budget, whose handoffs include planner: planner handed off and waits for
    nothing, so handing back to it is no re-entry (the guard allows it) and budget is not warned off."""
    otel_guard.configure(situational_prompt=True)
    planner, budget_agent = agents_handing_off_to_each_other(CallBudget(1))

    await Runner.run(planner, "Plan a trip to Lisbon.")

    assert user_messages(budget_agent.model)[0] == "Plan a trip to Lisbon."
    assert user_messages(planner.model)[0] == "Plan a trip to Lisbon."
