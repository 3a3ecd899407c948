"""An ADK agent run awaits its hop's budget store: a paused Redis holds the run's hop, never the
event loop (``budget_store=redis://...``: one Redis round trip a hop, awaited at the run's first step)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google_adk_models import ScriptedModel, final_text, run
from google_adk_spans import decisions

import otel_guard
from otel_guard import DelegationRefused
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from tests.core.redis_server import paused_under_probe, running_redis
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
        otel_guard.configure(max_hops=100, budget_store=redis.url, budget_on_error=on_error)
        assert final_text(await run(planner)) == "planner answers without tools"  # clients connected
        async with paused_under_probe(redis) as probe:
            if on_error == "allow":
                events = await run(planner)
            else:
                with pytest.raises(DelegationRefused) as refused:
                    await run(planner)
    assert probe.waited >= 0.2  # the hop waited for Redis, up to the store's timeout
    assert probe.max_lag < 0.1, probe.lags  # and the event loop did not
    outcome = [decision for _, decision, _ in decisions(spans)]
    if on_error == "allow":
        assert final_text(events) == "planner answers without tools"
        assert outcome == ["allow", "allow"]
    else:
        assert refused.value.reason == "budget"
        assert outcome == ["allow", "refuse"]
        assert len(model.requests) == 1  # the refused run never asked the model
