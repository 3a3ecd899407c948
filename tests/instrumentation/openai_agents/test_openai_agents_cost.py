"""A tree's budget in money in the OpenAI Agents SDK (issue 44.4), with the SDK's own ``ScriptedModel``.

Planner uses budget as a tool. Every response reports its usage as a real model's does (1,000 input
tokens, 400 of them cached, and 100 output), and the model object names its model as the SDK's
models do (``model``); a stream names it in its ``response.completed`` event. At the ``prices``
file's 10 (input), 1 (cached) and 100 (output) per million tokens a response costs 600 * 10 + 400 *
1 + 100 * 100 = 16,400 micro-units.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ModelStep, ScriptedModel
from agents.usage import Usage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from openai_agents_models import CallBudget, LoopModel, agents_as_tools_of_each_other

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from otel_guard.instrumentation.openai_agents._usage import TreeBudgetExceeded
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)

PRICES = {
    "acme-*": {"input": 10, "output": 100, "cache_read": 1},
    "scripted-model": {"input": 1, "output": 1},
}
PER_RESPONSE = 600 * 10 + 400 * 1 + 100 * 100


def usage() -> Usage:
    return Usage(
        requests=1,
        input_tokens=1000,
        input_tokens_details=InputTokensDetails(cached_tokens=400, cache_write_tokens=0),
        output_tokens=100,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        total_tokens=1100,
    )


class PricedModel(LoopModel):
    """A LoopModel that names its model and reports usage (and, given ``charged``, the provider's
    charge in its raw usage, as OpenRouter's ``usage.cost``)."""

    model = "acme-large"
    charged: float | None = None

    def _scripted(self) -> ScriptedModel:
        raw = {"cost": self.charged} if self.charged is not None else None
        return ScriptedModel(
            [
                ModelStep.respond(
                    lambda call: ModelStep(output=self._respond(call), usage=usage(), raw_usage=raw)
                )
            ]
        )


def tree(charged: float | None = None) -> tuple[Any, LoopModel, LoopModel]:
    calls = CallBudget(1)
    planner, budget = agents_as_tools_of_each_other(calls)
    planner.model = PricedModel("planner", "budget", calls)
    budget.model = PricedModel("budget", "planner", calls)
    planner.model.charged = budget.model.charged = charged
    # The SDK keeps a provider's raw usage (where OpenRouter's cost is) only when asked to.
    planner.model_settings = budget.model_settings = ModelSettings(preserve_raw_usage=True)
    return planner, planner.model, budget.model  # type: ignore[return-value]


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


async def test_every_response_is_priced_by_its_model_and_cached_tokens(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, planner_model, budget_model = tree()
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        await Runner.run(planner, "plan the offsite")
    assert (len(planner_model.calls), len(budget_model.calls)) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


async def test_a_cost_the_provider_reported_comes_first(instrumentor: OpenAIAgentsInstrumentor) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, _, _ = tree(charged=0.0005)
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        await Runner.run(planner, "plan the offsite")
    assert spent(hop.chain.root) == 3 * 500


async def test_a_tree_past_max_cost_ends_the_run_as_the_sdk_ends_one_at_its_limit(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    planner, planner_model, budget_model = tree()
    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 0\.03 USD \(max_cost 0\.03\)"):
        await Runner.run(planner, "plan the offsite")
    assert (len(planner_model.calls), len(budget_model.calls)) == (1, 1)  # 0.0164, 0.0328: no third
    [event] = [
        e for s in spans.named("invoke_agent planner") for e in s.events if e.name == "otel_guard.refused"
    ]
    assert event.attributes["otel_guard.budget.exhausted"] == "cost"


async def test_a_streamed_response_is_priced_by_the_model_its_completed_event_names(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, _, _ = tree()
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        result = Runner.run_streamed(planner, "plan the offsite")
        async for _ in result.stream_events():
            pass
    # The planner's two streamed responses: ScriptedModel's stream names "scripted-model" (1 and 1 per
    # million) in its completed event. Budget, run as a tool, is asked without a stream: its model's.
    assert spent(hop.chain.root) == 2 * (1000 + 100) + PER_RESPONSE


@function_tool
def lookup(input: str) -> str:
    """Look a figure up."""
    return "42"


async def test_a_budget_spent_in_an_agent_used_as_a_tool_reaches_the_caller_as_the_tools_error(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    """planner 0.0164, budget 0.0328: budget's lookup is a refused hop and its next request is refused
    in its own run; the planner's tool output is that reason (not the SDK's generic failure text), and
    the planner's next request, in the same spent tree, ends the root run."""
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    calls = CallBudget(5)
    budget = Agent(name="budget", model=PricedModel("budget", "lookup", calls), tools=[lookup])
    planner = Agent(name="planner", model=PricedModel("planner", "budget", calls))
    planner.tools = [budget.as_tool("budget", "Ask the budget agent.")]
    started = time.monotonic()
    with pytest.raises(TreeBudgetExceeded) as ended:
        await asyncio.wait_for(Runner.run(planner, "plan the offsite"), timeout=20)
    assert time.monotonic() - started < 20
    assert ended.value.run_data is not None
    outputs = [
        str(item.output) for item in ended.value.run_data.new_items if isinstance(item, ToolCallOutputItem)
    ]
    assert len(outputs) == 1
    assert "has spent its 0.03 USD (max_cost 0.03); the model request is refused" in outputs[0]
    assert (len(planner.model.calls), len(budget.model.calls)) == (1, 1)  # type: ignore[union-attr]
