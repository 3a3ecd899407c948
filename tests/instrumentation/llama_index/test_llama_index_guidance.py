"""Situational guidance in LlamaIndex: an agent that can call an agent on its call path is told so at
the start of its user turn, never in the system prompt."""

from __future__ import annotations

from instrumentors import instrumentor_fixture
from llama_index.core.base.llms.types import ChatMessage
from llama_index_loop import CallBudget, ScriptedModel, agent, build_handoffs, build_loop

import otel_guard
from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor

instrumented = instrumentor_fixture(LlamaIndexInstrumentor)

GUIDANCE = "[Execution context] You are currently running INSIDE the agentic function `budget`."


async def test_an_agent_with_a_tool_back_into_its_caller_is_told_its_path(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = build_loop(planner_tool="budget", budget_tool="planner", max_tool_calls=1)

    await loop.planner().run(user_msg="Plan the team offsite")

    # Budget, run by planner's `budget` tool, has a `planner` tool: its user turn starts with the path.
    (request,) = loop.budget_model.requests
    system, user = request.messages
    assert system == ("system", "You are budget.")  # never changed
    assert user[0] == "user"
    assert user[1].startswith(GUIDANCE)
    assert "You were called along the path planner → budget" in user[1]
    assert user[1].endswith("\n\nfrom planner")  # the question itself follows
    # Planner's own run stands on no path yet: its message is the user's, unchanged.
    assert loop.planner_model.requests[0].messages[1] == ("user", "Plan the team offsite")


async def test_a_chat_message_keeps_its_blocks_after_the_guidance(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    model = ScriptedModel("budget", None, CallBudget(0))
    budget = agent("budget", model, [build_loop(budget_tool="planner").tools["budget"]])

    with otel_guard.delegate("planner"):
        await budget.run(ChatMessage(role="user", content="price it"))

    (request,) = model.requests
    assert request.messages[1][1].startswith(GUIDANCE)
    assert request.messages[1][1].endswith("\nprice it")


async def test_no_guidance_without_the_setting_or_an_agent_on_the_path(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    loop = build_loop(planner_tool="budget", budget_tool="planner", max_tool_calls=1)
    await loop.planner().run(user_msg="Plan the team offsite")
    assert loop.budget_model.requests[0].messages[1] == ("user", "from planner")

    otel_guard.configure(situational_prompt=True)
    loop = build_loop(max_tool_calls=1)  # budget's tool is ask_planner: no agent of the path by name
    await loop.planner().run(user_msg="Plan the team offsite")
    assert loop.budget_model.requests[0].messages[1] == ("user", "from planner")


async def test_an_agent_workflow_counts_the_agents_it_may_hand_off_to(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    handoffs = build_handoffs(max_tool_calls=0)

    with otel_guard.delegate("budget"):  # the workflow runs inside budget's hop: planner -> budget is back
        await handoffs.workflow.run(user_msg="Plan the team offsite")

    (request,) = handoffs.planner_model.requests
    user = request.messages[1][1]
    assert user.startswith(
        "[Execution context] You are currently running INSIDE the agentic function `planner`."
    )
    assert "budget → planner" in user
