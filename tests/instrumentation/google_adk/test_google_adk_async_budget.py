"""An ADK agent run, and a transfer its model asks for, await their hop's budget store: a paused Redis
holds the hop, never the event loop (``budget_store=redis://...``: one Redis round trip a hop, awaited
at the run's first step, and when the model's call is decided)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google_adk_models import ScriptedModel, final_text, run, transferring_agents
from google_adk_spans import decisions

import otel_guard
from otel_guard import DelegationRefused
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from tests.core.redis_server import loop_probe, paused_under_probe, running_redis
from tests.instrumentation.instrumentors import instrumentor_fixture

pytestmark = pytest.mark.integration

instrumented = instrumentor_fixture(GoogleADKInstrumentor)


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_run_awaits_a_redis_that_does_not_answer(
    instrumented: GoogleADKInstrumentor, spans: Any, tmp_path: Path, on_error: str
) -> None:
    model = ScriptedModel(agent="planner")
    planner = LlmAgent(name="planner", description="Plans team events.", model=model)
    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        assert final_text(await run(planner)) == "planner answers without tools"  # clients connected
        async with paused_under_probe(redis) as probe:
            if on_error == "allow":
                events = await run(planner)
            else:
                with pytest.raises(DelegationRefused) as refused:
                    await run(planner)
    probe.assert_the_hop_waited_not_the_loop()
    outcome = [decision for _, decision, _ in decisions(spans)]
    if on_error == "allow":
        assert final_text(events) == "planner answers without tools"
        assert outcome == ["allow", "allow"]
    else:
        assert refused.value.reason == "budget"
        assert outcome == ["allow", "refuse"]
        assert len(model.requests) == 1  # the refused run never asked the model


class PausingModel(ScriptedModel):
    """planner's model: stops Redis before it answers once ``redis`` is set (after the run's hop)."""

    redis: Any = None

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        if self.redis is not None:
            self.redis.pause()
        async for response in super().generate_content_async(llm_request, stream):
            yield response


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_a_transfer_awaits_a_redis_that_does_not_answer(
    instrumented: GoogleADKInstrumentor, spans: Any, tmp_path: Path, on_error: str
) -> None:
    pair = transferring_agents(max_tool_calls=1)  # planner -> budget; budget answers
    pair.planner.model = model = PausingModel(
        agent="planner",
        tool="transfer_to_agent",
        tool_args={"agent_name": "budget"},
        tool_calls=pair.tool_calls,
    )
    with running_redis(tmp_path) as redis:
        otel_guard.configure(max_hops=100, budget_store=redis.probe_url, budget_on_error=on_error)
        assert final_text(await run(pair.planner)) == "budget answers without tools"  # clients connected
        pair.tool_calls.left, model.redis = 1, redis
        spans.clear()
        async with loop_probe() as probe:
            try:
                events = await run(pair.planner)
            finally:
                redis.resume()
    probe.assert_the_hop_waited_not_the_loop()
    transfer = [
        (decision, chain) for name, decision, chain in decisions(spans) if name == "invoke_agent budget"
    ]
    if on_error == "allow":
        assert transfer == [("allow", ("planner", "budget"))]
        assert final_text(events) == "budget answers without tools"
    else:
        assert transfer == [("refuse", ("planner", "budget"))]
        assert final_text(events) == "planner answers after transfer_to_agent error"  # it read why
