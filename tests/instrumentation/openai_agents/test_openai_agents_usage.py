"""A tree's model requests and tokens in the OpenAI Agents SDK (issue 11).

Planner uses budget as a tool (``Agent.as_tool``); budget answers on its own. The tree's model
requests: planner's tool call, budget's answer, planner's answer: three, in a run and a nested run.
"""

from __future__ import annotations

from typing import Any

import pytest
from agents import Runner
from agents.exceptions import MaxTurnsExceeded
from agents.usage import Usage
from openai_agents_models import CallBudget, LoopModel, agents_as_tools_of_each_other

import otel_guard
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from otel_guard.instrumentation.openai_agents._usage import TreeBudgetExceeded
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)
TOKENS_A_RESPONSE = 15


class BilledModel(LoopModel):
    """A LoopModel whose every response reports usage, as a real model's does."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        response = await super().get_response(*args, **kwargs)
        response.usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=TOKENS_A_RESPONSE)
        return response


def tree(model: type[LoopModel] = LoopModel) -> tuple[Any, LoopModel, LoopModel]:
    calls = CallBudget(1)  # planner calls budget once; budget answers on its own
    planner, budget = agents_as_tools_of_each_other(calls)
    planner.model = model("planner", "budget", calls)
    budget.model = model("budget", "planner", calls)
    return planner, planner.model, budget.model  # type: ignore[return-value]


async def test_with_room_for_them_every_request_is_made(instrumentor: OpenAIAgentsInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    planner, planner_model, budget_model = tree()
    result = await Runner.run(planner, "plan the offsite")
    assert result.final_output.startswith("planner answers")
    assert (len(planner_model.calls), len(budget_model.calls)) == (2, 1)


async def test_a_tree_that_made_its_model_requests_ends_the_run_as_the_sdk_ends_one_at_its_limit(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    planner, planner_model, budget_model = tree()
    with pytest.raises(MaxTurnsExceeded, match=r"has made its 2 model requests") as ended:
        await Runner.run(planner, "plan the offsite")
    assert isinstance(ended.value, TreeBudgetExceeded)
    assert (len(planner_model.calls), len(budget_model.calls)) == (1, 1)  # the third was never made
    [event] = [
        e for s in spans.named("invoke_agent planner") for e in s.events if e.name == "otel_guard.refused"
    ]
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


async def test_the_tokens_of_every_response_count_and_a_spent_tree_stops(
    instrumentor: OpenAIAgentsInstrumentor,
) -> None:
    # Two responses' tokens: planner's tool call and budget's answer spend them; planner may not
    # ask again.
    otel_guard.configure(max_tokens=2 * TOKENS_A_RESPONSE)
    planner, planner_model, budget_model = tree(BilledModel)
    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 30 model tokens \(max_tokens 30\)"):
        await Runner.run(planner, "plan the offsite")
    assert (len(planner_model.calls), len(budget_model.calls)) == (1, 1)
    otel_guard.configure(max_tokens=3 * TOKENS_A_RESPONSE + 1)
    planner, planner_model, budget_model = tree(BilledModel)
    await Runner.run(planner, "plan the offsite")
    assert (len(planner_model.calls), len(budget_model.calls)) == (2, 1)


async def test_a_streamed_run_is_checked_and_counted_as_well(instrumentor: OpenAIAgentsInstrumentor) -> None:
    otel_guard.configure(max_model_requests=2)
    planner, planner_model, budget_model = tree()
    result = Runner.run_streamed(planner, "plan the offsite")
    with pytest.raises(TreeBudgetExceeded):
        async for _ in result.stream_events():
            pass
    assert len(planner_model.calls) + len(budget_model.calls) == 2


async def test_observe_mode_lets_every_request_through(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    planner, _planner_model, _budget_model = tree()
    result = await Runner.run(planner, "plan the offsite")
    assert result.final_output.startswith("planner answers")
    events = [e.attributes.get("otel_guard.budget.exhausted") for s in spans.all() for e in s.events]
    assert events.count("model_requests") == 2  # budget's request and planner's answer
