"""Situational guidance in Google ADK: an agent that can call an agent on its call path is told so at
the start of its user turn, never in its instructions; an agent with no such tool is told nothing."""

from __future__ import annotations

from google.adk.agents import LlmAgent
from google.adk.tools.agent_tool import AgentTool
from google_adk_models import USER_TURN, ScriptedModel, ToolCalls, agents_as_tools, run, transferring_agents

import otel_guard
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from otel_guard.prompt import situational_prefix
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(GoogleADKInstrumentor)


async def test_budget_called_by_planner_is_warned_off_its_planner_tool(
    instrumented: GoogleADKInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    pair = agents_as_tools(max_tool_calls=2)  # planner -> budget -> planner (refused)

    await run(pair.planner)

    # The path planner -> budget: budget's tools hold planner, an agent on it.
    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert "do NOT call `planner` either" in expected
    assert pair.budget_model.user_texts == [[expected, "what does it cost?"]] * 2  # both of its requests
    # Only the requests carry it: the instructions never do.
    for request in pair.budget_model.requests:
        assert "Execution context" not in request.system_instruction
    # Planner (path: planner alone) has a budget tool, but budget is not on its path: no guidance.
    assert pair.planner_model.user_texts == [[USER_TURN], [USER_TURN]]


async def test_an_agent_with_itself_as_a_tool_is_warned_off_it(instrumented: GoogleADKInstrumentor) -> None:
    otel_guard.configure(situational_prompt=True)
    pair = agents_as_tools(max_tool_calls=1)
    pair.planner.tools.append(pair.budget.tools[0])  # planner can now call planner too

    await run(pair.planner)

    expected = situational_prefix("planner", "Plans team events.", path=["planner"])
    # Each request gets it once: the session's user event is left as the user wrote it.
    assert pair.planner_model.user_texts == [[expected, USER_TURN]] * 2


async def test_a_transferred_to_agent_is_not_warned_off_handing_back(
    instrumented: GoogleADKInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    pair = transferring_agents(max_tool_calls=1)  # planner -> budget; budget answers

    await run(pair.planner)

    # Budget may transfer to planner, which is on its path but handed off (it waits for nothing): a
    # transfer back is allowed, so nothing warns budget off it.
    (texts,) = pair.budget_model.user_texts
    assert texts
    assert not any("Execution context" in text for text in texts)
    assert pair.planner_model.user_texts == [[USER_TURN]]


async def test_an_agent_that_could_transfer_to_an_agent_waiting_for_it_is_warned_off(
    instrumented: GoogleADKInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    # planner asks budget as an AgentTool; budget may transfer to its sub-agent named planner, but the
    # planner on its path waits for budget's answer: that transfer would be a cycle.
    inner = LlmAgent(name="planner", model=ScriptedModel(agent="inner planner"))
    budget = LlmAgent(name="budget", model=ScriptedModel(agent="budget"), sub_agents=[inner])
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(agent="planner", tool="budget", tool_calls=ToolCalls(1)),
        tools=[AgentTool(budget)],
    )

    await run(planner)

    budget_model: ScriptedModel = budget.model  # type: ignore[assignment]
    expected = situational_prefix("budget", "", path=["planner", "budget"])
    assert budget_model.user_texts == [[expected, "what does it cost?"]]


async def test_no_guidance_unless_it_is_asked_for(instrumented: GoogleADKInstrumentor) -> None:
    pair = agents_as_tools(max_tool_calls=2)

    await run(pair.planner)

    assert pair.budget_model.user_texts == [["what does it cost?"]] * 2
