"""A tree's budget in money in smolagents (issue 44.4), with the tests' scripted ``Model``.

Planner asks budget through a tool; budget answers at once. Each scripted response reports 10 input
and 5 output tokens, and each model its ``model_id`` (``scripted-planner``, ``scripted-budget``), as
smolagents' models do; at the ``prices`` file's 1,000 and 2,000 per million tokens a response costs
10 * 1,000 + 5 * 2,000 = 20,000 micro-units (0.02).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from smolagents.utils import AgentGenerationError
from smolagents_loop import Loop, ScriptedModel, StreamingScriptedModel, build_loop

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.smolagents import SmolagentsInstrumentor
from otel_guard.instrumentation.smolagents._usage import TreeBudgetExceeded
from tests.hop_spans import hop_named

instrumented = instrumentor_fixture(SmolagentsInstrumentor)

PRICES = {"scripted-*": {"input": 1000, "output": 2000}}
PER_RESPONSE = 20_000


def tree(model: type[ScriptedModel] = ScriptedModel) -> Loop:
    return build_loop(max_tool_calls=1, model=model)


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", [ScriptedModel, StreamingScriptedModel], ids=["generate", "stream"])
def test_every_response_of_the_tree_is_priced_by_its_model_id(
    instrumented: SmolagentsInstrumentor, model: type[ScriptedModel]
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree(model)
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        loop.planner().run("plan the offsite")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


def test_a_tree_past_max_cost_ends_the_run_with_smolagents_generation_error(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    loop = tree()
    with pytest.raises(AgentGenerationError, match=r"has spent its 0\.03 USD \(max_cost 0\.03\)") as ended:
        loop.planner().run("plan the offsite")
    assert isinstance(ended.value.__cause__, TreeBudgetExceeded)
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)  # 0.02, 0.04
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.budget.exhausted"] == "cost"


def test_a_model_no_price_covers_is_unpriced(
    instrumented: SmolagentsInstrumentor, metric_reader: Any
) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse")
    loop = tree()
    with pytest.raises(AgentGenerationError, match="no price covers"):
        loop.planner().run("plan the offsite")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 0)
    counted = {
        attributes.get("gen_ai.request.model")
        for attributes, _ in metric_reader.points("otel_guard.budget.unpriced")
    }
    assert "scripted-planner" in counted
