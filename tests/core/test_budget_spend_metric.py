"""What trees spent, from the guard's own process: ``otel_guard.budget.spend`` (issue 44.6).

A counter in units of ``cost_currency`` (a float: the sum of the priced costs' integer micro-units,
over a million), by ``cost_currency`` and ``gen_ai.request.model``, added once for each priced response that
cost anything while ``max_cost`` is on: the amount its tree's budget store takes. A response no price
covers adds nothing to it (it is counted in ``otel_guard.budget.unpriced``).
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

import otel_guard
from otel_guard import delegate
from otel_guard._prices import MICROS
from otel_guard._pricing import forget_warnings
from otel_guard.budget import store_for
from otel_guard.usage import ModelUsage, aafter_model_request, after_model_request

SPEND = "otel_guard.budget.spend"
UNPRICED = "otel_guard.budget.unpriced"


@pytest.fixture(autouse=True)
def _warn_again() -> None:
    forget_warnings()


def points(metric_reader: Any, name: str, model: str) -> list[tuple[dict[str, object], Any]]:
    return [(a, p) for a, p in metric_reader.points(name) if a.get("gen_ai.request.model") == model]


def spend(metric_reader: Any, model: str) -> float | None:
    found = points(metric_reader, SPEND, model)
    if not found:
        return None
    ((_attributes, point),) = found
    value: float = point.value
    return value


def test_the_counter_is_what_the_tree_spent_to_the_micro_unit(metric_reader: Any, unique: Any) -> None:
    model = unique("scripted")
    # 2.5 input, 10 output, 0.3 cache read a million tokens: 2.5, 10 and 0.3 micro-units a token.
    prices = {model: {"input": "2.5", "output": 10, "cache_read": "0.3"}}
    otel_guard.configure(max_cost="100", prices=prices)
    responses = [
        ModelUsage(model, 1_001, 333),  # 2502.5 + 3330: 5833 micro-units, rounded up
        ModelUsage(model, 40_000, 1_200, cache_read_tokens=30_000),  # 25000 + 9000 + 12000
        ModelUsage(model, 7, 1),  # 17.5 + 10: 28
        # A charge the provider reported comes first: 0.0123456789 USD is 12346 micro-units (rounded up).
        ModelUsage(model, 10, 10, reported_cost=Decimal("0.0123456789")),
    ]
    with delegate("planner") as planner:
        for response in responses:
            after_model_request(response)
    assert planner.chain is not None
    settings = otel_guard.settings.current_settings()
    taken = store_for(settings).used(f"tree:default:{planner.chain.root}:cost", time.time())
    assert taken == 5_833 + 46_000 + 28 + 12_346  # by hand, and what the tree's store took
    value = spend(metric_reader, model)
    assert value is not None
    # Exact: the sum is kept in integer micro-units and made a float once, so the counter is the
    # store's count over a million to the last bit, not a sum of rounded floats.
    assert value == taken / MICROS
    assert round(value * MICROS) == taken


def test_its_attributes_are_the_currency_and_the_model(metric_reader: Any, unique: Any) -> None:
    model = unique("euro-model")
    otel_guard.configure(max_cost="5", cost_currency="eur", prices={model: {"input": 1, "output": 2}})
    with delegate("planner"):
        after_model_request(ModelUsage(model, 1_000, 500))
    ((attributes, point),) = points(metric_reader, SPEND, model)
    assert attributes == {"cost_currency": "EUR", "gen_ai.request.model": model}
    assert round(point.value * MICROS) == 2_000


async def test_async_code_counts_the_same(metric_reader: Any, unique: Any) -> None:
    model = unique("scripted")
    otel_guard.configure(max_cost="1", prices={model: {"input": 10, "output": 30}})
    async with delegate("planner"):
        await aafter_model_request(ModelUsage(model, 100, 10))
        await aafter_model_request(ModelUsage(model, 100, 10))
    value = spend(metric_reader, model)
    assert value is not None
    assert round(value * MICROS) == 2 * 1_300


def test_an_unpriced_response_is_counted_as_unpriced_and_not_as_spend(
    metric_reader: Any, unique: Any
) -> None:
    priced, homegrown = unique("priced"), unique("homegrown")
    otel_guard.configure(max_cost="1", prices={priced: {"input": 10, "output": 30}})
    with delegate("planner"):
        after_model_request(ModelUsage(homegrown, 100, 10))
        after_model_request(ModelUsage(priced, 100, 10))
    assert spend(metric_reader, homegrown) is None
    assert [p.value for _a, p in points(metric_reader, UNPRICED, homegrown)] == [1]
    value = spend(metric_reader, priced)
    assert value is not None
    assert round(value * MICROS) == 1_300
    assert points(metric_reader, UNPRICED, priced) == []


def test_a_provider_charge_with_no_model_name_is_spent_by_unknown(metric_reader: Any) -> None:
    before = spend(metric_reader, "unknown") or 0.0
    otel_guard.configure(max_cost="1")
    with delegate("planner"):
        after_model_request(ModelUsage(None, 10, 10, reported_cost=Decimal("0.000042")))
    after = spend(metric_reader, "unknown")
    assert after is not None
    assert round((after - before) * MICROS) == 42


def test_nothing_is_counted_without_max_cost_nor_outside_a_hop_nor_for_nothing_used(
    metric_reader: Any, unique: Any
) -> None:
    model = unique("scripted")
    prices = {model: {"input": 10, "output": 30}}
    # max_tokens alone: responses are not priced at all (a hop's cost is the tokens' alone).
    otel_guard.configure(max_tokens=10**6, prices=prices)
    with delegate("planner"):
        after_model_request(ModelUsage(model, 100, 10))
    otel_guard.configure(max_cost="1", prices=prices)
    after_model_request(ModelUsage(model, 100, 10))  # no tree to spend it
    with delegate("planner"):
        after_model_request(ModelUsage(model, 0, 0))  # nothing used: nothing paid
    otel_guard.configure(max_cost="1", prices=prices, mode="off")
    with delegate("planner"):
        after_model_request(ModelUsage(model, 100, 10))
    assert spend(metric_reader, model) is None
    # The same response in a guarded hop with max_cost on is counted: the checks above could fail.
    otel_guard.configure(max_cost="1", prices=prices, mode="enforce")
    with delegate("planner"):
        after_model_request(ModelUsage(model, 100, 10))
    value = spend(metric_reader, model)
    assert value is not None
    assert round(value * MICROS) == 1_300
