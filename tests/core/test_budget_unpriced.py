"""Unpriced is visible (issue 44.3): a response no price covers is counted, warned of once per model,
and with ``budget_unpriced=refuse`` ends its tree's model requests and hops.

pydantic-ai #7133: one model that no table priced made a capped run under-count about 100 times,
without a word. Here the same response shows in ``otel_guard.budget.unpriced`` and in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard._pricing import forget_warnings
from otel_guard.usage import ModelUsage, after_model_request, before_model_request

EXHAUSTED = "otel_guard.budget.exhausted"


@pytest.fixture(autouse=True)
def _warn_again() -> None:
    forget_warnings()


def unpriced(metric_reader: Any) -> dict[object, object]:
    return {
        attributes.get("gen_ai.request.model"): point.value
        for attributes, point in metric_reader.points("otel_guard.budget.unpriced")
    }


def warnings_of(caplog: pytest.LogCaptureFixture, model: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "otel_guard" and f"model {model} " in r.getMessage()
    ]


def test_an_unpriced_response_is_counted_and_warned_of_once_per_model(
    metric_reader: Any, caplog: pytest.LogCaptureFixture, unique: Any
) -> None:
    model, other = unique("homegrown"), unique("homegrown")
    otel_guard.configure(max_cost="1")
    with caplog.at_level(logging.WARNING, logger="otel_guard"), delegate("planner"):
        for _ in range(3):
            after_model_request(ModelUsage(model, 100, 10))
            assert before_model_request() is None  # allow: the tree goes on
        after_model_request(ModelUsage(other, 100, 10))
    counts = unpriced(metric_reader)
    assert (counts.get(model), counts.get(other)) == (3, 1)
    assert len(warnings_of(caplog, model)) == 1
    assert len(warnings_of(caplog, other)) == 1
    assert "budget_unpriced=refuse" in warnings_of(caplog, model)[0]


def test_a_response_of_a_runtime_that_names_no_model_is_unpriced_as_unknown(metric_reader: Any) -> None:
    before = unpriced(metric_reader).get("unknown", 0)
    otel_guard.configure(max_cost="1")
    with delegate("planner"):
        after_model_request(120)  # a bare token count: no model to price
    assert unpriced(metric_reader).get("unknown", 0) == before + 1  # type: ignore[operator]


def test_budget_unpriced_refuse_refuses_the_trees_next_request_and_hop(spans: Any, unique: Any) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse", prices={"priced": {"input": 1, "output": 1}})
    with delegate("planner") as planner:
        assert planner.chain is not None
        after_model_request(ModelUsage("priced", 100, 10))
        assert before_model_request() is None  # a priced response leaves the tree going
        after_model_request(ModelUsage(unique("homegrown"), 100, 10))
        refused = before_model_request()
        with pytest.raises(DelegationRefused) as caught, delegate("worker"):
            pass
    root = planner.chain.root
    assert refused == (
        f"Delegation budget: tree {root} had a model response that no price covers (budget_unpriced "
        "refuse), so its spend against max_cost is unknown; the model request is refused"
    )
    assert caught.value.reason == "budget"
    assert spans.one("invoke_agent worker").attributes[EXHAUSTED] == "cost"
    event = next(e for e in spans.one("invoke_agent planner").events if e.name == "otel_guard.refused")
    assert event.attributes is not None
    assert event.attributes[EXHAUSTED] == "cost"


def test_another_tree_is_not_refused_for_one_trees_unpriced_response(unique: Any) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse")
    with delegate("planner"):
        after_model_request(ModelUsage(unique("homegrown"), 100, 10))
        assert before_model_request() is not None
    with delegate("planner"):
        assert before_model_request() is None
