"""OpenAI Agents SDK runs and handoffs await their hop's budget store: a paused Redis holds the hop,
never the event loop (``budget_store=redis://...``: one Redis round trip a hop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner
from openai_agents_helpers import attrs
from openai_agents_models import CallBudget, LoopModel, agents_handing_off_to_each_other

import otel_guard
from otel_guard import DelegationRefused
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from tests.core.redis_server import RedisServer, loop_probe, paused_under_probe, running_redis
from tests.instrumentation.instrumentors import instrumentor_fixture

pytestmark = pytest.mark.integration

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)
TASK = "Plan a trip to Lisbon."


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_run_awaits_a_redis_that_does_not_answer(
    instrumentor: OpenAIAgentsInstrumentor, tmp_path: Path, on_error: str
) -> None:
    planner = Agent(name="planner", instructions="Plan the trip.")
    planner.model = LoopModel("planner", None, CallBudget(0))
    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        assert (await Runner.run(planner, TASK)).final_output  # the store's clients are connected
        async with paused_under_probe(redis) as probe:
            if on_error == "allow":
                result = await Runner.run(planner, TASK)
            else:
                with pytest.raises(DelegationRefused) as refused:
                    await Runner.run(planner, TASK)
    probe.assert_the_hop_waited_not_the_loop()
    if on_error == "allow":
        assert result.final_output == "planner answers on its own"
    else:
        assert refused.value.reason == "budget"
        assert len(planner.model.calls) == 1  # the refused run never asked the model


class PausingModel(LoopModel):
    """planner's model: stops Redis before it answers (a handoff), once the run's hop has started."""

    def __init__(self, redis: RedisServer, budget: CallBudget) -> None:
        super().__init__("planner", "transfer_to_budget", budget)
        self.redis = redis
        self.pause = False

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        if self.pause:
            self.redis.pause()
        return await super().get_response(*args, **kwargs)


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_handoff_awaits_a_redis_that_does_not_answer(
    instrumentor: OpenAIAgentsInstrumentor, spans: Any, tmp_path: Path, on_error: str
) -> None:
    budget = CallBudget(1)  # planner -> budget, then budget answers on its own
    planner, _ = agents_handing_off_to_each_other(budget)
    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        planner.model = model = PausingModel(redis, budget)
        await Runner.run(planner, TASK)  # the store's clients are connected
        budget.left, model.pause = 1, True
        spans.clear()
        async with loop_probe() as probe:
            try:
                result = await Runner.run(planner, TASK)
            finally:
                redis.resume()
    probe.assert_the_hop_waited_not_the_loop()
    (handoff,) = spans.named("invoke_agent budget")
    if on_error == "allow":
        assert attrs(handoff)["otel_guard.decision"] == "allow"
        assert result.final_output == "budget answers on its own"
    else:
        assert attrs(handoff)["otel_guard.decision"] == "refuse"
        assert attrs(handoff)["otel_guard.reason"] == "budget"
        assert str(result.final_output).startswith("planner answers: ")  # it read the refusal
