"""A tree's budget in money in Agno (issue 46), on the tests' scripted ``Model``.

Planner asks budget through a tool; budget answers at once. Each scripted response reports 5 input
and 5 output tokens in Agno's ``MessageMetrics``, and each model its ``id`` (``scripted-planner``,
``scripted-budget``); at the ``prices`` file's 1,000 and 2,000 per million tokens a response costs
5 * 1,000 + 5 * 2,000 = 15,000 micro-units (0.015). The tree's three requests: planner's tool call,
budget's answer, planner's answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agno_loop import Loop, build_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.agno import AgnoInstrumentor
from tests.hop_spans import hop_named

instrumented = instrumentor_fixture(AgnoInstrumentor)

PRICES = {"scripted-*": {"input": 1000, "output": 2000}}
PER_RESPONSE = 15_000


def tree() -> Loop:
    loop = build_loop(calls=1)
    loop.planner_model.id = "scripted-planner"
    loop.budget_model.id = "scripted-budget"
    return loop


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


@pytest.mark.parametrize("run", ["run", "arun", "stream"])
def test_every_response_of_the_tree_is_priced_by_its_model_id(
    instrumented: AgnoInstrumentor, run: str
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        planner = loop.planner()
        if run == "arun":
            content = asyncio.run(planner.arun("plan the offsite")).content
        elif run == "stream":
            content = "".join(
                str(event.content) for event in planner.run("plan the offsite", stream=True) if event.content
            )
        else:
            content = planner.run("plan the offsite").content
    assert content == "planner answers after budget answers"
    assert (loop.planner_model.requests, loop.budget_model.requests) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


def test_a_tree_past_max_cost_ends_the_run_with_the_refusal(
    instrumented: AgnoInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    loop = tree()

    output = loop.planner().run("plan the offsite")

    # 0.015 after planner's tool call, 0.03 after budget's answer: planner's answer is refused.
    assert (loop.planner_model.requests, loop.budget_model.requests) == (1, 1)
    assert str(output.status) == "RunStatus.error"
    assert "has spent its 0.03 USD (max_cost 0.03); the model request is refused" in str(output.content)
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.budget.exhausted"] == "cost"


def test_a_model_no_price_covers_is_unpriced(instrumented: AgnoInstrumentor, metric_reader: Any) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse")
    loop = tree()

    output = loop.planner().run("plan the offsite")

    assert str(output.status) == "RunStatus.error"
    assert "no price covers" in str(output.content)
    assert (loop.planner_model.requests, loop.budget_model.requests) == (1, 0)
    counted = {
        attributes.get("gen_ai.request.model")
        for attributes, _ in metric_reader.points("otel_guard.budget.unpriced")
    }
    assert "scripted-planner" in counted
