"""A tree's budget in money in Google ADK (issue 44.4), with the tests' ``BaseLlm`` subclass.

Planner has budget as a tool (``AgentTool``); budget answers. Each scripted response reports 7
prompt and 7 candidates tokens in its ``usage_metadata``; its model is ADK's ``BaseLlm.model``
(``scripted``). At the ``prices`` file's 1,000 and 2,000 per million tokens a response costs 7 *
1,000 + 7 * 2,000 = 21,000 micro-units.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.agents.invocation_context import LlmCallsLimitExceededError
from google.adk.runners import InMemoryRunner
from google.adk.tools.agent_tool import AgentTool
from google.genai import types
from google_adk_models import TOKENS_PER_RESPONSE, Pair, ScriptedModel, ToolCalls, agents_as_tools, run

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from otel_guard.instrumentation.google_adk._usage import model_usage
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(GoogleADKInstrumentor)

PRICES = {"scripted": {"input": 1000, "output": 2000}}
PER_RESPONSE = TOKENS_PER_RESPONSE * 1000 + TOKENS_PER_RESPONSE * 2000


def tree() -> Pair:
    return agents_as_tools(max_tool_calls=1)


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


async def test_every_response_of_the_tree_is_priced_by_the_agents_model(
    instrumented: GoogleADKInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    pair = tree()
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        await run(pair.planner)
    assert (len(pair.planner_model.requests), len(pair.budget_model.requests)) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


async def test_a_tree_past_max_cost_ends_the_run_with_adks_limit_error(
    instrumented: GoogleADKInstrumentor,
) -> None:
    otel_guard.configure(max_cost="0.04", prices=PRICES)  # planner 0.021, budget 0.042
    pair = tree()
    with pytest.raises(LlmCallsLimitExceededError, match=r"has spent its 0\.04 USD \(max_cost 0\.04\)"):
        await run(pair.planner)
    assert (len(pair.planner_model.requests), len(pair.budget_model.requests)) == (1, 1)


def test_gemini_usage_is_priced_as_gemini_bills_it() -> None:
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=1000,
        cached_content_token_count=600,
        candidates_token_count=50,
        thoughts_token_count=30,
        total_token_count=1080,
    )
    priced = model_usage(usage, "gemini-2.5-flash")
    assert (priced.input_tokens, priced.cache_read_tokens, priced.output_tokens) == (1000, 600, 80)
    assert priced.tokens == 1080  # max_tokens counts what it counted before


async def drain(events: Any) -> None:
    async for _ in events:
        pass


def lookup(question: str) -> str:
    """Look a figure up."""
    return "42"


async def test_a_budget_spent_in_an_agent_tool_reaches_the_caller_as_the_tools_error(
    instrumented: GoogleADKInstrumentor,
) -> None:
    """planner 0.021, budget 0.042: budget's lookup is a refused hop and its next request is refused
    in its own run; the planner's ``AgentTool`` call gets that reason as its error response (it
    propagated through the planner's run before), and the planner's next request ends the run."""
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    calls = ToolCalls(5)
    budget_model = ScriptedModel(agent="budget", tool="lookup", tool_calls=calls)
    budget = LlmAgent(name="budget", description="Prices plans.", model=budget_model, tools=[lookup])
    planner_model = ScriptedModel(agent="planner", tool="budget", tool_calls=calls)
    planner = LlmAgent(
        name="planner", description="Plans.", model=planner_model, tools=[AgentTool(agent=budget)]
    )
    runner = InMemoryRunner(agent=planner, app_name="offsite")
    session = await runner.session_service.create_session(app_name="offsite", user_id="user")
    message = types.Content(role="user", parts=[types.Part.from_text(text="plan the offsite")])
    started = time.monotonic()
    try:
        with pytest.raises(LlmCallsLimitExceededError, match=r"max_cost 0\.03"):
            await asyncio.wait_for(
                drain(runner.run_async(user_id="user", session_id=session.id, new_message=message)), 20
            )
        assert time.monotonic() - started < 20
        stored = await runner.session_service.get_session(
            app_name="offsite", user_id="user", session_id=session.id
        )
    finally:
        await runner.close()
    assert stored is not None
    responses = [
        part.function_response
        for event in stored.events
        for part in (event.content.parts or [] if event.content else [])
        if part.function_response is not None and part.function_response.name == "budget"
    ]
    assert len(responses) == 1
    assert "has spent its 0.03 USD (max_cost 0.03); the model request is refused" in str(
        (responses[0].response or {}).get("error")
    )
    assert (len(planner_model.requests), len(budget_model.requests)) == (1, 1)
