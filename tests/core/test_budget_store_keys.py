"""A poisoned key in the Redis store hurts its own tree only (issue 23.4); memory and Redis count alike.

A key overwritten by someone with access to the Redis (a string that is not a count, a list, a number
out of range) is that key's error: its tree gets ``budget_on_error``, ``otel_guard.budget.store_errors``
counts it as ``bad_value`` or ``bad_type``, every other tree goes on being counted, and the bad key
still expires. A take is all or none even then. Counts stop at 2^53 - 1 on both stores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
from opentelemetry import context
from redis_server import RedisServer
from test_budget import store_errors, store_errors_since

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard.budget import (
    HOPS,
    MAX_COUNT,
    TOKENS,
    WORKSPACE_HOPS,
    BudgetStore,
    MemoryStore,
    Meter,
    StoreError,
)
from otel_guard.budget.redis_store import RedisStore
from otel_guard.policy import CLOCK_SKEW
from otel_guard.usage import after_model_request, before_model_request

pytestmark = pytest.mark.integration

BUDGET_HOPS = "otel_guard.budget.hops"

Poison = Callable[[redis.Redis, str], None]

POISONS: dict[str, tuple[Poison, str]] = {
    "a string": (lambda client, key: client.set(key, "abc"), "bad_value"),
    "a list": (lambda client, key: client.rpush(key, "1", "2"), "bad_type"),
    "a decimal": (lambda client, key: client.set(key, "1.5"), "bad_value"),
    "a huge integer": (lambda client, key: client.set(key, "99999999999999999999999"), "bad_value"),
    "past 2^53": (lambda client, key: client.set(key, str(2**63 - 1)), "bad_value"),
    "a negative count": (lambda client, key: client.set(key, "-3"), "bad_value"),
}


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


def hop_counts_of_a_new_tree(hops: int) -> list[int]:
    """Start a tree of its own (an empty context) and make ``hops`` hops in it; their counts."""
    token = context.attach(context.Context())
    try:
        counts = []
        with delegate("other") as first:
            assert first.span.attributes is not None
            counts.append(int(first.span.attributes[BUDGET_HOPS]))
            for index in range(hops - 1):
                with delegate(f"worker{index}") as hop:
                    assert hop.span.attributes is not None
                    counts.append(int(hop.span.attributes[BUDGET_HOPS]))
        return counts
    finally:
        context.detach(token)


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("on_error", ["allow", "refuse"])
def test_a_poisoned_tree_key_is_that_trees_error_alone(
    redis_server: RedisServer, client: redis.Redis, metric_reader: Any, poison: str, on_error: str
) -> None:
    otel_guard.configure(max_hops=5, budget_store=redis_server.url, budget_on_error=on_error)
    write, error_type = POISONS[poison]
    with delegate("planner") as planner:  # hop 1 of its tree, counted
        assert planner.chain is not None
        key = f"tree:default:{planner.chain.root}"
        client.delete(key)
        write(client, key)  # someone with access to the Redis overwrites the tree's count
        before = store_errors(metric_reader)
        if on_error == "allow":
            with delegate("budget") as hop:
                pass
            assert hop.decision == "allow"
            assert hop.span.attributes is not None
            assert BUDGET_HOPS not in hop.span.attributes  # nothing could be counted
        else:
            with pytest.raises(DelegationRefused) as refused, delegate("budget"):
                pass
            assert refused.value.reason == "budget"
            assert str(refused.value) == (
                f"Delegation budget: the budget store's key {key} does not hold a count ({error_type}) "
                "and budget_on_error is refuse; agent budget refused"
            )
        # At once, another tree in the same store is counted as if nothing had happened: the store
        # was not taken for down.
        assert hop_counts_of_a_new_tree(3) == [1, 2, 3]
    assert store_errors_since(before, metric_reader) == {error_type: 1}
    # The bad key is left as it is (evidence), but it expires when the tree's count would have.
    expires_ms = client.pexpiretime(key)
    assert abs(expires_ms / 1000 - (planner.chain.expires_at + CLOCK_SKEW)) < 0.01
    assert client.type(key) == (b"list" if error_type == "bad_type" else b"string")


def test_a_take_whose_second_key_is_bad_counts_nothing(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    store = RedisStore(redis_server.url)
    now = time.time()
    tree = Meter("tree:ws:a", 5, now + 60, HOPS)
    workspace = Meter("workspace:ws:60:1", 10, now + 30, WORKSPACE_HOPS)
    assert store.take([tree, workspace], now) == (1, 1)
    client.set("workspace:ws:60:1", "1.5")
    with pytest.raises(StoreError) as raised:
        store.take([tree, workspace], now)
    assert raised.value.error_type == "bad_value"
    assert client.get("tree:ws:a") == b"1"  # the good key before the bad one is not counted either
    assert client.get("workspace:ws:60:1") == b"1.5"
    client.rpush("tree:ws:b", "x")
    with pytest.raises(StoreError) as raised:
        store.take([Meter("tree:ws:b", 5, now + 60, HOPS), Meter("tree:ws:a", 5, now + 60, HOPS)], now)
    assert raised.value.error_type == "bad_type"
    assert client.get("tree:ws:a") == b"1"
    assert store.take([tree], now) == (2,)  # the store still answers the good keys
    store.close()


def test_a_good_count_that_lost_its_expiry_gets_it_back(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    store = RedisStore(redis_server.url)
    now = time.time()
    client.set("tree:ws:a", "3")  # a count with no expiry
    assert store.take([Meter("tree:ws:a", 5, now + 60, HOPS)], now) == (4,)
    assert abs(client.pexpiretime("tree:ws:a") - int((now + 60) * 1000)) <= 1
    store.close()


# -- the same numbers on both stores -----------------------------------------------------------------


def takes(store: BudgetStore, steps: Sequence[tuple[int, int]], now: float) -> list[tuple[int, ...] | int]:
    """Each (limit, amount) as a take on one tree's token count, then a check at that limit."""
    answers: list[tuple[int, ...] | int] = []
    for limit, amount in steps:
        answers.append(store.take([Meter("tree:ws:tokens", limit, now + 60, TOKENS, amount)], now))
        two = [Meter("tree:ws:hops", 0, now + 60, HOPS), Meter("tree:ws:tokens", limit, now + 60, TOKENS, 0)]
        answers.append(store.take(two, now))
    return answers


LARGE_STEPS = [
    (0, 5),
    (0, 2**53 - 10),  # 2^53 - 5: below the largest count
    (2**53 - 1, 4),  # exactly the largest count: a check at that limit refuses (nothing more fits)
    (0, 1),  # past it: the count stays at the largest
    (0, 2**63),  # past what Redis's INCRBY takes
    (2**70, 0),  # a limit past the largest is the largest
    (0, 2**80),
]
LARGE_ANSWERS: list[tuple[int, ...] | int] = [
    (5,),
    (1, 5),
    (2**53 - 5,),
    (2, 2**53 - 5),
    (MAX_COUNT,),
    1,
    (MAX_COUNT,),
    (3, MAX_COUNT),
    (MAX_COUNT,),
    (4, MAX_COUNT),
    0,
    1,
    (MAX_COUNT,),
    (5, MAX_COUNT),
]


def test_memory_and_redis_count_the_same_large_numbers(redis_server: RedisServer) -> None:
    assert MAX_COUNT == 2**53 - 1
    now = time.time()
    redis_store = RedisStore(redis_server.url)
    memory = takes(MemoryStore(), LARGE_STEPS, now)
    in_redis = takes(redis_store, LARGE_STEPS, now)
    redis_store.close()
    assert memory == in_redis
    assert memory == LARGE_ANSWERS


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_a_response_of_more_tokens_than_redis_can_add_is_counted(
    redis_server: RedisServer, where: str
) -> None:
    """2^64 tokens reported (a runtime's bug, or a hostile model server): the tree's tokens are spent."""
    store = "memory" if where == "memory" else redis_server.url
    otel_guard.configure(max_tokens=1000, budget_store=store, budget_on_error="allow")
    with delegate("planner"):
        assert before_model_request() is None
        after_model_request(2**64)
        refused = before_model_request()
    assert refused is not None
    assert "has spent its 1000 model tokens" in refused


async def test_an_async_hop_meets_a_poisoned_key_as_a_sync_one_does(
    redis_server: RedisServer, client: redis.Redis, metric_reader: Any
) -> None:
    otel_guard.configure(max_hops=5, budget_store=redis_server.url, budget_on_error="refuse")
    async with delegate("planner") as planner:
        assert planner.chain is not None
        key = f"tree:default:{planner.chain.root}"
        client.set(key, "abc")
        before = store_errors(metric_reader)
        with pytest.raises(DelegationRefused) as refused:
            async with delegate("budget"):
                pass
        assert f"the budget store's key {key} does not hold a count (bad_value)" in str(refused.value)
        token = context.attach(context.Context())
        try:
            async with delegate("other") as other:  # another tree, at once: counted
                pass
        finally:
            context.detach(token)
    assert other.span.attributes is not None
    assert other.span.attributes[BUDGET_HOPS] == 1
    assert store_errors_since(before, metric_reader) == {"bad_value": 1}
    assert client.pttl(key) > 0
