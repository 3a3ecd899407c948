"""A tree's budget in money (issue 44.1): ``max_cost``, ``cost_currency``, ``prices``, ``budget_unpriced``.

Settings read and checked at start, with errors that name the variable and the entry; a tree's spend
in integer micro-units of the currency, in the memory store and on a real redis-server (a single one,
a cluster, Sentinel), added in the same take as its tokens; the request, and the hop, that would
start past ``max_cost`` refused as every other budget's (reason ``budget``, exhausted ``cost``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard.budget import COST, MemoryStore, Meter, store_for
from otel_guard.budget.redis_fleet import cluster_keys
from otel_guard.settings import configure, settings_from_env
from otel_guard.usage import ModelUsage, abefore_model_request, after_model_request, before_model_request

EXHAUSTED = "otel_guard.budget.exhausted"
PRICES = {"scripted": {"input": 10, "output": 30}}
"""10 and 30 per million tokens: 10 and 30 micro-units a token."""


def usage(input_tokens: int, output_tokens: int, model: str = "scripted") -> ModelUsage:
    return ModelUsage(model, input_tokens, output_tokens)


def spend_keys(root: str) -> tuple[str, str]:
    return f"tree:default:{root}:cost", f"tree:default:{root}:tokens"


# -- settings -----------------------------------------------------------------------------------


def test_the_money_settings_are_read_from_their_variables(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"gpt-4o": {"input": "2.5", "output": 10, "cache_read": 1.25}}))
    settings = settings_from_env(
        {
            "OTEL_GUARD_MAX_COST": "0.50",
            "OTEL_GUARD_COST_CURRENCY": "eur",
            "OTEL_GUARD_PRICES": str(prices),
            "OTEL_GUARD_BUDGET_UNPRICED": "refuse",
        }
    )
    assert settings.max_cost == Decimal("0.50")
    assert settings.cost_currency == "EUR"
    assert settings.budget_unpriced == "refuse"
    assert settings.prices is not None
    found = settings.prices.find("gpt-4o")
    assert found is not None
    assert (found.input, found.output, found.cache_read, found.cache_write) == (
        Decimal("2.5"),
        Decimal(10),
        Decimal("1.25"),
        Decimal("2.5"),
    )
    assert settings.model_budgets_on
    assert settings.budgets_on
    defaults = settings_from_env({})
    assert (defaults.max_cost, defaults.cost_currency, defaults.prices, defaults.budget_unpriced) == (
        0,
        "USD",
        None,
        "allow",
    )
    assert not defaults.model_budgets_on


def test_configure_takes_an_amount_as_text_a_number_or_a_decimal() -> None:
    assert configure(max_cost="1.25").max_cost == Decimal("1.25")
    assert configure(max_cost=2).max_cost == Decimal(2)
    assert configure(max_cost=0.1).max_cost == Decimal("0.1")  # the float's shortest text, not its binary
    assert configure(max_cost=Decimal("0.000001")).max_cost == Decimal("0.000001")
    assert configure(prices=PRICES).prices == configure(prices=PRICES).prices


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_GUARD_MAX_COST", "ten", "OTEL_GUARD_MAX_COST: max_cost: 'ten' is not a decimal amount"),
        (
            "OTEL_GUARD_MAX_COST",
            "-1",
            "OTEL_GUARD_MAX_COST: max_cost: '-1' must be a finite amount of at least 0",
        ),
        (
            "OTEL_GUARD_MAX_COST",
            "NaN",
            "OTEL_GUARD_MAX_COST: max_cost: 'NaN' must be a finite amount of at least 0",
        ),
        (
            "OTEL_GUARD_MAX_COST",
            "0.0000001",
            "OTEL_GUARD_MAX_COST: max_cost: '0.0000001' is finer than a millionth of the currency",
        ),
        (
            "OTEL_GUARD_COST_CURRENCY",
            "dollars",
            "OTEL_GUARD_COST_CURRENCY: cost_currency: 'dollars' is not an ISO 4217 currency code "
            "(three letters: USD, EUR)",
        ),
        (
            "OTEL_GUARD_BUDGET_UNPRICED",
            "ignore",
            "OTEL_GUARD_BUDGET_UNPRICED: budget_unpriced: 'ignore' is not one of allow, refuse",
        ),
    ],
)
def test_a_bad_money_setting_names_its_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=variable) as caught:
        settings_from_env({variable: value})
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"gpt-4o": {"input": 1}}', "'gpt-4o': no output price (per million tokens)"),
        ('{"gpt-4o": {"input": 1, "output": 2, "cached": 1}}', "'gpt-4o': unknown cached; an entry holds"),
        (
            '{"gpt-4o": {"input": -1, "output": 2}}',
            "'gpt-4o': input: -1 must be a finite amount of at least 0",
        ),
        ('{"gpt-4o": {"input": "cheap", "output": 2}}', "'gpt-4o': input: 'cheap' is not a decimal amount"),
        ('{"gpt-4o": {"input": true, "output": 2}}', "'gpt-4o': input: True is not a decimal amount"),
        ('{"gpt-4o": [1, 2]}', "'gpt-4o': expected a mapping of input, output"),
        ('{"gpt-4o": {"input": 1, "output": 2, "currency": "euro"}}', "'gpt-4o': currency: 'euro' is not"),
        (
            '{"gpt-4o": {"input": 1, "output": 2}, "acme-*": {"input": 1, "output": 2, "currency": "EUR"}}',
            "'acme-*' is priced in EUR, but cost_currency is USD",
        ),
        ("[1, 2]", "is not a mapping of model name to prices"),
        ("{not json", "is not JSON"),
    ],
)
def test_a_bad_prices_file_is_a_settings_error_naming_the_entry(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="OTEL_GUARD_PRICES") as caught:
        settings_from_env({"OTEL_GUARD_PRICES": str(path)})
    text = str(caught.value)
    assert text.startswith(f"OTEL_GUARD_PRICES: prices: {path}")
    assert message in text


def test_a_prices_file_that_is_missing_or_bad_yaml_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^OTEL_GUARD_PRICES: prices: cannot read .*nowhere.json"):
        settings_from_env({"OTEL_GUARD_PRICES": str(tmp_path / "nowhere.json")})
    bad = tmp_path / "prices.yaml"
    bad.write_text("gpt-4o: {input: 1, output: [\n")
    with pytest.raises(ValueError, match=r"prices\.yaml is not YAML"):
        settings_from_env({"OTEL_GUARD_PRICES": str(bad)})


def test_a_yaml_prices_file_with_globs_and_its_own_currency(tmp_path: Path) -> None:
    path = tmp_path / "prices.yml"
    path.write_text(
        "acme-large: {input: 3, output: 9, currency: EUR}\n"
        "'acme-*': {input: 1, output: 2, cache_read: 0.5, cache_write: 4}\n"
    )
    settings = settings_from_env({"OTEL_GUARD_PRICES": str(path), "OTEL_GUARD_COST_CURRENCY": "EUR"})
    assert settings.prices is not None
    large, small = settings.prices.find("acme-large"), settings.prices.find("acme-small-2025")
    assert large is not None
    assert large.input == 3
    assert small is not None
    assert small.cache_write == 4
    assert settings.prices.find("other") is None
    # 1000 input of which 200 read from the cache and 100 written to it, 10 output:
    # 700 * 1 + 200 * 0.5 + 100 * 4 + 10 * 2 micro-units.
    assert small.cost(1000, 10, 200, 100) == 700 + 100 + 400 + 20


# -- spend and refusal, in memory ---------------------------------------------------------------


def test_the_request_and_the_hop_past_max_cost_are_refused_as_cost(spans: Any) -> None:
    otel_guard.configure(max_cost="0.01", prices=PRICES)  # 10,000 micro-units
    with delegate("planner") as planner:
        assert planner.chain is not None
        root = planner.chain.root
        assert before_model_request() is None
        after_model_request(usage(400, 100))  # 4,000 + 3,000
        assert before_model_request() is None
        after_model_request(usage(300, 100))  # 3,000 + 3,000: 13,000, past the cap by this response
        refused = before_model_request()
        with pytest.raises(DelegationRefused) as caught, delegate("worker"):
            pass
    assert store_for(otel_guard.settings.current_settings()).used(spend_keys(root)[0], time.time()) == 13_000
    assert refused == (
        f"Delegation budget: tree {root} has spent its 0.01 USD (max_cost 0.01); the model request is refused"
    )
    event = next(e for e in spans.one("invoke_agent planner").events if e.name == "otel_guard.refused")
    assert event.attributes is not None
    assert event.attributes[EXHAUSTED] == COST
    assert event.attributes["otel_guard.reason"] == "budget"
    err = caught.value
    assert (err.reason, err.code) == ("budget", "a2a_delegation_budget")
    assert (
        str(err)
        == f"Delegation budget: tree {root} has spent its 0.01 USD (max_cost 0.01); agent worker refused"
    )
    assert spans.one("invoke_agent worker").attributes[EXHAUSTED] == COST


def test_observe_mode_lets_the_request_past_max_cost_through_as_would_refuse(spans: Any) -> None:
    otel_guard.configure(mode="observe", max_cost="0.000001", prices=PRICES)
    with delegate("planner"):
        after_model_request(usage(1, 0))
        assert before_model_request() is None
    event = next(e for e in spans.one("invoke_agent planner").events if e.name == "otel_guard.would_refuse")
    assert event.attributes is not None
    assert event.attributes[EXHAUSTED] == COST


class Takes(MemoryStore):
    """The memory store, keeping the meters of each take (to see what goes in one)."""

    def __init__(self) -> None:
        super().__init__()
        self.takes: list[tuple[Meter, ...]] = []

    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        self.takes.append(tuple(meters))
        return super().take(meters, now)


@pytest.fixture
def takes() -> Iterator[Takes]:
    store = Takes()
    otel_guard.budget._stores["memory"] = store
    return store


def test_a_responses_tokens_and_cost_go_in_one_take(takes: Takes) -> None:
    otel_guard.configure(max_tokens=10_000, max_cost="1", prices=PRICES)
    with delegate("planner") as planner:
        assert planner.chain is not None
        takes.takes.clear()
        after_model_request(usage(100, 10))
    root = planner.chain.root
    assert [[(m.key, m.amount) for m in take] for take in takes.takes] == [
        [(f"tree:default:{root}:tokens", 110), (f"tree:default:{root}:cost", 1_300)]
    ]


def test_without_max_cost_a_response_is_not_priced(takes: Takes, metric_reader: Any) -> None:
    otel_guard.configure(max_tokens=10_000)
    before = unpriced_counts(metric_reader)
    with delegate("planner"):
        takes.takes.clear()
        after_model_request(usage(100, 10, model="no-such-model"))
    assert [[m.budget for m in take] for take in takes.takes] == [["tokens"]]
    assert unpriced_counts(metric_reader) == before


def unpriced_counts(metric_reader: Any) -> dict[object, object]:
    return {
        attributes.get("gen_ai.request.model"): point.value
        for attributes, point in metric_reader.points("otel_guard.budget.unpriced")
    }


# -- on Redis -----------------------------------------------------------------------------------


def spend_and_refuse(url: str) -> tuple[str, str | None]:
    """Spend 13,000 micro-units of a 10,000 cap through the store at ``url``: the root, the refusal."""
    otel_guard.configure(
        budget_store=f"{url}?socket_timeout=2",  # a loaded test host: a take that times out fails the test
        budget_on_error="refuse",
        max_cost="0.01",
        max_tokens=10**6,
        prices=PRICES,
    )
    with delegate("planner") as planner:
        assert planner.chain is not None
        after_model_request(usage(400, 100))
        assert before_model_request() is None
        after_model_request(usage(300, 100))
        refused = before_model_request()
    return planner.chain.root, refused


@pytest.mark.integration
def test_spend_counts_on_a_real_redis(redis_server: Any) -> None:
    root, refused = spend_and_refuse(redis_server.url)
    assert refused is not None
    assert "max_cost 0.01" in refused
    client = redis_server.client()
    cost, tokens = spend_keys(root)
    assert (int(client.get(cost)), int(client.get(tokens))) == (13_000, 900)
    assert 0 < client.pttl(cost) <= (300 + 30) * 1000  # it expires with its chain


@pytest.mark.integration
async def test_spend_counts_on_a_real_redis_from_async_code(redis_server: Any) -> None:
    otel_guard.configure(budget_store=redis_server.url, max_cost="0.000010", prices=PRICES)
    async with delegate("planner") as planner:
        assert planner.chain is not None
        assert await abefore_model_request() is None
        from otel_guard.usage import aafter_model_request

        await aafter_model_request(usage(1, 0))
        refused = await abefore_model_request()
    assert refused is not None
    assert "max_cost 0.00001)" in refused
    assert int(redis_server.client().get(spend_keys(planner.chain.root)[0])) == 10


def test_on_a_cluster_a_trees_spend_shares_the_slot_of_its_other_counts() -> None:
    root = "0123456789abcdef0123456789abcdef"
    keys = [
        f"tree:default:{root}{suffix}" for suffix in ("", ":model_requests", ":tokens", ":cost", ":unpriced")
    ]
    for workspace_cap in (False, True):
        tagged = cluster_keys(keys, workspace_cap)
        assert len({key_slot(key.encode()) for key in tagged}) == 1
        assert all(key.endswith(keys[i][len(f"tree:default:{root}") :]) for i, key in enumerate(tagged))


@pytest.mark.integration
def test_spend_counts_on_a_real_redis_cluster(tmp_path: Path) -> None:
    from redis_fleet import running_cluster

    with running_cluster(tmp_path, masters=3, replicas=0) as cluster:
        root, refused = spend_and_refuse(cluster.url)
        assert refused is not None
        assert "max_cost 0.01" in refused
        store = store_for(otel_guard.settings.current_settings())
        assert store.used(spend_keys(root)[0], time.time()) == 13_000
        store.close()  # type: ignore[attr-defined]


@pytest.mark.integration
def test_spend_counts_through_real_sentinel(tmp_path: Path) -> None:
    from redis_fleet import running_sentinels

    with running_sentinels(tmp_path) as sentinels:
        root, refused = spend_and_refuse(sentinels.url)
        assert refused is not None
        assert "max_cost 0.01" in refused
        assert int(sentinels.master.client().get(spend_keys(root)[0])) == 13_000
