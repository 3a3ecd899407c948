"""The price of a model response, in the contract's order (issue 44.2).

First a cost the provider reported in its response (an actual charge, in ``cost_currency``), then
the ``prices`` file, then genai-prices' bundled table (USD only); rounded up to whole micro-units.
The table is the installed release's: a process whose every connection is refused prices from it all
the same (``programs/price_offline.py``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import genai_prices
import pytest

from otel_guard._prices import micros
from otel_guard._pricing import ModelUsage, price, reported_cost
from otel_guard.settings import configure

FILE = {"gpt-4o": {"input": 1, "output": 2}, "acme-*": {"input": "0.1", "output": 3, "cache_read": "0.05"}}


def table(model: str, input_tokens: int, output_tokens: int, **cache: int) -> int:
    """What genai-prices itself says, in micro-units: the oracle."""
    usage = genai_prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens, **cache)
    return micros(genai_prices.calc_price(usage, model).total_price)


def test_a_cost_the_provider_reported_comes_first() -> None:
    settings = configure(max_cost="1", prices=FILE)
    reported = ModelUsage("gpt-4o", 1000, 500, reported_cost=Decimal("0.0123"))
    assert price(reported, settings) == 12_300
    # A reported cost of 0 (a cached answer) is a real cost, not a missing one.
    assert price(reported._replace(reported_cost=Decimal(0)), settings) == 0


def test_a_cost_reported_in_another_currency_falls_through_to_the_prices_file() -> None:
    settings = configure(max_cost="1", cost_currency="EUR", prices=FILE)
    usage = ModelUsage("gpt-4o", 1000, 500, reported_cost=Decimal("0.0123"), reported_currency="USD")
    assert price(usage, settings) == 1000 * 1 + 500 * 2


def test_the_prices_file_comes_before_genai_prices() -> None:
    settings = configure(max_cost="1", prices=FILE)
    assert price(ModelUsage("gpt-4o", 1000, 500), settings) == 2_000
    assert table("gpt-4o", 1000, 500) != 2_000  # the file's price is not the table's


def test_genai_prices_prices_what_the_file_does_not(metric_reader: Any) -> None:
    settings = configure(max_cost="1", prices=FILE)
    assert price(ModelUsage("claude-sonnet-4-5", 1000, 500), settings) == table(
        "claude-sonnet-4-5", 1000, 500
    )
    cached = ModelUsage("gpt-4o", 1000, 500, cache_read_tokens=600, provider="openai")
    assert price(cached, configure(prices=None)) == table("gpt-4o", 1000, 500, cache_read_tokens=600)
    assert table("gpt-4o", 1000, 500, cache_read_tokens=600) < table("gpt-4o", 1000, 500)


def test_a_provider_genai_prices_does_not_know_is_asked_by_the_model_alone() -> None:
    settings = configure(max_cost="1")
    usage = ModelUsage("gpt-4o", 1000, 500, provider="acme-cloud")
    assert price(usage, settings) == table("gpt-4o", 1000, 500)


def test_genai_prices_is_in_usd_only() -> None:
    settings = configure(max_cost="1", cost_currency="EUR")
    assert price(ModelUsage("gpt-4o", 1000, 500), settings) is None


def test_cache_tokens_are_priced_from_the_file_and_rounded_up() -> None:
    settings = configure(max_cost="1", prices=FILE)
    # 1000 input, 600 of them read from the cache: 400 * 0.1 + 600 * 0.05 + 7 * 3 = 40 + 30 + 21.
    assert price(ModelUsage("acme-small", 1000, 7, cache_read_tokens=600), settings) == 91
    # One token at 0.1 per million is a tenth of a micro-unit: one micro-unit, never nothing.
    assert price(ModelUsage("acme-small", 1, 0), settings) == 1


def test_a_response_that_used_nothing_costs_nothing_whatever_its_model() -> None:
    assert price(ModelUsage("no-such-model", 0, 0), configure(max_cost="1")) == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.0042, Decimal("0.0042")), ("0.5", Decimal("0.5")), (0, Decimal(0)), (None, None), ("n/a", None)],
)
def test_a_reported_cost_is_read_as_a_decimal(value: object, expected: Decimal | None) -> None:
    assert reported_cost(value) == expected
    assert reported_cost(-1) is None
    assert reported_cost(True) is None


def test_genai_prices_prices_with_every_connection_refused(run_program: Any) -> None:
    """No fetch at run time: a process that cannot open a connection prices from the bundled table."""
    responses = [["gpt-4o", 1000, 500], ["claude-sonnet-4-5", 2000, 100]]
    result = run_program("price_offline.py", {"responses": responses})
    assert result["control"].startswith("no egress in this test")  # the hook does refuse connections
    assert result["blocked"] == []  # and nothing asked for one
    assert result["spent"] == sum(table(model, i, o) for model, i, o in responses)


def test_genai_prices_is_asked_once_for_a_model_it_has_no_price_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its failing look-up walks every provider's patterns: 70 k instructions a response, each time.
    asked: list[tuple[str, str | None]] = []
    calc_price = genai_prices.calc_price
    expected = table("gpt-4o", 1_000, 100)

    def counted(usage: Any, model: str, *, provider_id: str | None = None, **rest: Any) -> Any:
        asked.append((model, provider_id))
        return calc_price(usage, model, provider_id=provider_id, **rest)

    monkeypatch.setattr(genai_prices, "calc_price", counted)
    settings = configure(max_cost=100)
    homegrown = ModelUsage("homegrown-llm-7", 1_000, 100, provider="acme")
    known = ModelUsage("gpt-4o", 1_000, 100)
    for _ in range(3):
        assert price(homegrown, settings) is None
        assert price(known, settings) == expected
    assert asked.count(("homegrown-llm-7", "acme")) == 1
    assert asked.count(("homegrown-llm-7", None)) == 1
    assert asked.count(("gpt-4o", None)) == 3
