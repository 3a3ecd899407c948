"""Situational guidance in the Claude Agent SDK: where a run or a sub-agent can call an agent on its
call path, its user turn carries the guidance (a sub-agent's prompt leads with it; a run's prompt
gets it as the CLI's additional context of the turn); the system prompt is never changed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from claude_loop import agent_of, scripted_loop
from instrumentors import instrumentor_fixture
from scripted_api import last_user_blocks, system_text

import otel_guard
from otel_guard.instrumentation.claude_agent_sdk import ClaudeAgentSDKInstrumentor

pytestmark = pytest.mark.integration

instrumented = instrumentor_fixture(ClaudeAgentSDKInstrumentor)

WARNING = "[Execution context] You are currently running INSIDE the agentic function `budget`."


def first_turn_of(requests: list[dict[str, Any]], agent: str) -> dict[str, Any]:
    return next(r for r in requests if agent_of(r) == agent)


def turn_text(request: dict[str, Any]) -> str:
    return "\n".join(str(block.get("text", "")) for block in last_user_blocks(request))


@pytest.mark.parametrize("subagents", [False, True], ids=["run", "sub-agent"])
def test_an_agent_that_can_call_back_up_its_path_is_told_so(
    instrumented: ClaudeAgentSDKInstrumentor, subagents: bool
) -> None:
    otel_guard.configure(situational_prompt=True)
    with scripted_loop(max_tool_calls=1, subagents=subagents) as loop:
        asyncio.run(loop.run("planner", "Plan the team offsite"))
        assert loop.api is not None
        budget = first_turn_of(loop.api.agent_requests(), "budget")

    text = turn_text(budget)
    assert WARNING in text
    assert "planner → budget" in text
    assert WARNING not in system_text(budget)


def test_off_by_default(instrumented: ClaudeAgentSDKInstrumentor) -> None:
    with scripted_loop(max_tool_calls=1, subagents=True) as loop:
        asyncio.run(loop.run("planner", "Plan the team offsite"))
        assert loop.api is not None
        budget = first_turn_of(loop.api.agent_requests(), "budget")
    assert "[Execution context]" not in turn_text(budget)
