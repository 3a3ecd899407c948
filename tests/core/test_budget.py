"""Budgets for a whole delegation tree (issue 11): every hop of every branch counts, once, per chain root.

The memory store (this process). The Redis store, shared by processes, is in ``test_budget_redis.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import context, propagate

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard.budget import HOPS, WORKSPACE_HOPS, MemoryStore, Meter, StoreError, store_for
from otel_guard.settings import DEFAULT_MAX_HOPS, settings_from_env

BUDGET_HOPS = "otel_guard.budget.hops"
EXHAUSTED = "otel_guard.budget.exhausted"


def decisions(spans: Any) -> list[tuple[str, str, str | None]]:
    """(span name, decision, reason) of every guard span, in the order they ended."""
    return [
        (s.name, s.attributes["otel_guard.decision"], s.attributes.get("otel_guard.reason"))
        for s in spans.all()
        if "otel_guard.decision" in (s.attributes or {})
    ]


# -- one tree -----------------------------------------------------------------------------------


def hops_until_refused(agents: list[str]) -> tuple[int, DelegationRefused | None]:
    """Enter a hop into each agent in turn (siblings); how many ran before the first refusal."""
    made = 0
    for agent in agents:
        try:
            with delegate(agent):
                made += 1
        except DelegationRefused as err:
            return made, err
    return made, None


def test_the_hop_past_max_hops_is_refused_with_reason_budget(spans: Any) -> None:
    otel_guard.configure(max_hops=5)
    with delegate("planner") as planner:
        made, err = hops_until_refused([f"worker{i}" for i in range(10)])
    assert made == 4  # planner's own hop is the first of the five
    assert err is not None
    assert err.reason == "budget"
    assert err.code == "a2a_delegation_budget"
    assert err.retryable is False
    assert err.status == 409
    assert planner.chain is not None
    root = planner.chain.root
    assert str(err) == (
        f"Delegation budget: tree {root} has made its 5 hops (max_hops 5); "
        "calling agent worker4 would make one more"
    )
    refused_span = spans.one("invoke_agent worker4")
    assert refused_span.attributes[EXHAUSTED] == HOPS
    assert refused_span.attributes["otel_guard.reason"] == "budget"
    assert BUDGET_HOPS not in refused_span.attributes  # a refused hop spends nothing
    assert [spans.one(f"invoke_agent worker{i}").attributes[BUDGET_HOPS] for i in range(4)] == [2, 3, 4, 5]
    assert spans.one("invoke_agent planner").attributes[BUDGET_HOPS] == 1


async def test_a_fan_out_tree_of_tasks_counts_every_branch_exactly() -> None:
    """20 branches of 3 hops each under one planner: 61 hops wanted, 40 allowed, all from one root."""
    otel_guard.configure(max_hops=40)
    allowed: list[str] = []
    refused: list[str] = []

    async def branch(index: int) -> None:
        for step in range(3):
            try:
                async with delegate(f"w{index}", f"step{step}"):
                    allowed.append(f"w{index}.{step}")
                    await asyncio.sleep(0)
            except DelegationRefused as err:
                refused.append(err.reason)

    async with delegate("planner"):
        await asyncio.gather(*(branch(i) for i in range(20)))
    assert len(allowed) == 39  # 40 with the planner's own hop
    assert refused == ["budget"] * (60 - 39)


def race_for_the_last_units(threads: int) -> tuple[list[int], list[str]]:
    """``threads`` threads, released at once, each making one hop in one tree; who got one, and the
    reasons of those refused."""
    allowed: list[int] = []
    refused: list[str] = []
    start = threading.Barrier(threads)
    with delegate("planner"):
        ctx = context.get_current()

        def hop(index: int) -> None:
            token = context.attach(ctx)
            try:
                start.wait()
                with delegate(f"worker{index}"):
                    allowed.append(index)
            except DelegationRefused as err:
                refused.append(err.reason)
            finally:
                context.detach(token)

        racers = [threading.Thread(target=hop, args=(i,)) for i in range(threads)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(10)
    return allowed, refused


def test_twenty_threads_racing_for_the_last_units_never_overshoot() -> None:
    """Each thread makes one hop in the same tree; only as many as the budget has left get one."""
    otel_guard.configure(max_hops=11)
    allowed, refused = race_for_the_last_units(20)
    assert len(allowed) == 10
    assert refused == ["budget"] * 10


def test_two_trees_have_budgets_of_their_own() -> None:
    otel_guard.configure(max_hops=3)
    for _ in range(2):
        with delegate("planner"), delegate("budget"), delegate("fx"):
            pass
        with delegate("planner"), delegate("budget"), delegate("fx"):
            made, err = hops_until_refused(["ledger"])
        assert made == 0
        assert err is not None
        assert err.reason == "budget"


def test_a_repeated_hop_from_one_chain_counts_every_time() -> None:
    """The decision is reused for a hop repeated from the same chain; the budget is not."""
    otel_guard.configure(max_hops=4)
    calls = 0
    with delegate("planner"):
        for _ in range(10):
            try:
                with delegate("search", kind="tool"):
                    calls += 1
            except DelegationRefused:
                break
    assert calls == 3


# -- what never counts ----------------------------------------------------------------------------


def test_refused_and_would_refuse_hops_never_count(spans: Any) -> None:
    otel_guard.configure(max_hops=4, cycle_rule="agent")
    with delegate("planner"), delegate("budget"):
        with pytest.raises(DelegationRefused) as refused, delegate("planner"):
            pass
        assert refused.value.reason == "cycle"
        with delegate("fx") as fx:  # the cycle refusal spent nothing: this is hop 3 of 4
            pass
    assert fx.span.attributes is not None
    assert fx.span.attributes[BUDGET_HOPS] == 3
    otel_guard.configure(mode="observe")
    with delegate("planner"), delegate("budget"):
        with delegate("planner") as again:  # would-refuse (cycle): runs, counts nothing
            pass
        assert again.decision == "would_refuse"
        with delegate("fx") as fx:
            pass
    assert fx.span.attributes is not None
    assert fx.span.attributes[BUDGET_HOPS] == 3


def test_off_mode_counts_nothing(spans: Any) -> None:
    otel_guard.configure(max_hops=1, mode="off")
    with delegate("planner"), delegate("budget"), delegate("fx"):
        pass
    assert all(BUDGET_HOPS not in (s.attributes or {}) for s in spans.all())


def test_observe_mode_lets_a_spent_budget_through_as_would_refuse(spans: Any) -> None:
    otel_guard.configure(max_hops=2, mode="observe")
    ran = []
    with delegate("planner"), delegate("budget"):
        for agent in ("fx", "ledger"):
            with delegate(agent) as hop:
                ran.append((agent, hop.decision))
    assert ran == [("fx", "would_refuse"), ("ledger", "would_refuse")]
    fx = spans.one("invoke_agent fx")
    assert fx.attributes["otel_guard.reason"] == "budget"
    assert fx.attributes[EXHAUSTED] == HOPS
    assert BUDGET_HOPS not in fx.attributes  # nothing was spent
    assert [event.name for event in fx.events] == ["otel_guard.would_refuse"]


def test_max_hops_zero_turns_the_tree_budget_off(spans: Any) -> None:
    otel_guard.configure(max_hops=0)
    with delegate("planner"):
        for index in range(DEFAULT_MAX_HOPS + 5):
            with delegate("search", f"q{index % 3}", kind="tool"):
                pass
    assert all(BUDGET_HOPS not in (s.attributes or {}) for s in spans.all())


def test_a_hop_received_from_the_callers_process_is_not_counted_twice() -> None:
    """A server's hop that continues the hop its caller's instrumentation added counts once: there."""
    otel_guard.configure(max_hops=2)
    carrier: dict[str, str] = {}
    with delegate("planner"), delegate("budget"):  # the caller's two hops: the budget is spent
        propagate.inject(carrier)
    arrived = propagate.extract(carrier)
    token = context.attach(arrived)
    try:
        with delegate("budget", receiving=True) as received:  # the server side of the last hop
            assert received.decision == "allow"
    finally:
        context.detach(token)


# -- the workspace cap ----------------------------------------------------------------------------


def test_the_workspace_cap_counts_every_tree_in_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    otel_guard.configure(max_hops=0, workspace_max_hops=3, workspace_window=60)
    now = [6_000_000.0]  # a window boundary: 100 000 windows of 60 s since the epoch
    monkeypatch.setattr(time, "time", lambda: now[0])
    for _ in range(3):
        with delegate("planner"):
            pass
    with pytest.raises(DelegationRefused) as refused, delegate("planner"):
        pass
    assert refused.value.reason == "budget"
    assert "workspace 'default' has made its 3 hops this window" in str(refused.value)
    now[0] += 59.9  # same window
    with pytest.raises(DelegationRefused), delegate("planner"):
        pass
    now[0] += 0.2  # the next window
    with delegate("planner"):
        pass


def test_a_hop_past_the_workspace_cap_spends_nothing_of_its_tree(spans: Any) -> None:
    otel_guard.configure(max_hops=10, workspace_max_hops=2)
    with delegate("planner"), delegate("budget"):
        made, err = hops_until_refused(["fx"])
    assert made == 0
    assert err is not None
    refused = spans.one("invoke_agent fx")
    assert refused.attributes[EXHAUSTED] == WORKSPACE_HOPS
    otel_guard.configure(workspace_max_hops=0)
    with delegate("planner") as planner:
        pass
    assert planner.span.attributes is not None
    assert planner.span.attributes[BUDGET_HOPS] == 1


# -- a store that cannot answer -------------------------------------------------------------------


def store_errors(metric_reader: Any) -> dict[str, int]:
    """The store-error counter by error type (cumulative for the session)."""
    return {
        attributes["error.type"]: point.value
        for attributes, point in metric_reader.points("otel_guard.budget.store_errors")
    }


def store_errors_since(before: dict[str, int], metric_reader: Any) -> dict[str, int]:
    """The store errors counted since ``before`` (a :func:`store_errors`), by error type."""
    after = store_errors(metric_reader)
    return {
        kind: count - before.get(kind, 0) for kind, count in after.items() if count != before.get(kind, 0)
    }


class DownStore:
    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        raise StoreError("the store is down")


@pytest.fixture
def down_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel_guard.guard, "store_for", lambda settings: DownStore())


def test_a_store_error_with_budget_on_error_allow_lets_the_hop_run_uncounted(
    down_store: None, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(max_hops=1, budget_on_error="allow")
    before = store_errors(metric_reader)
    with delegate("planner"), delegate("budget") as hop:
        pass
    assert hop.decision == "allow"
    assert hop.span.attributes is not None
    assert BUDGET_HOPS not in hop.span.attributes
    assert store_errors_since(before, metric_reader) == {"StoreError": 2}


def test_a_store_error_with_budget_on_error_refuse_refuses_with_reason_budget(down_store: None) -> None:
    otel_guard.configure(budget_on_error="refuse")
    with pytest.raises(DelegationRefused) as refused, delegate("planner"):
        pass
    assert refused.value.reason == "budget"
    assert "budget store could not be reached (StoreError)" in str(refused.value)


# -- the memory store itself ----------------------------------------------------------------------


def test_the_memory_store_takes_all_meters_or_none() -> None:
    store = MemoryStore()
    tree = Meter("tree:ws:a", 5, 100.0, HOPS)
    workspace = Meter("workspace:ws:60:1", 2, 100.0, WORKSPACE_HOPS)
    assert store.take([tree, workspace], 1.0) == (1, 1)
    assert store.take([tree, workspace], 1.0) == (2, 2)
    assert store.take([tree, workspace], 1.0) == 1  # the workspace is spent: the tree is not counted
    assert store.used("tree:ws:a", 1.0) == 2


def test_the_memory_store_forgets_counts_when_they_expire() -> None:
    store = MemoryStore()
    for index in range(MemoryStore.SWEEP_EVERY):
        assert store.take([Meter(f"tree:ws:{index}", 0, 10.0, HOPS)], 1.0) == (1,)
    assert store.take([Meter("tree:ws:0", 1, 20.0, HOPS)], 11.0) == (1,)  # expired: it starts again
    for _ in range(MemoryStore.SWEEP_EVERY):
        store.take([Meter("tree:ws:late", 0, 20.0, HOPS)], 11.0)
    assert len(store) == 2  # the sweep dropped every expired tree; the two alive stay
    assert store.used("tree:ws:0", 11.0) == 1


def test_one_memory_store_serves_the_process() -> None:
    settings = otel_guard.configure()
    assert store_for(settings) is store_for(settings)
    assert isinstance(store_for(settings), MemoryStore)


# -- settings ----------------------------------------------------------------------------------------


def test_the_budget_defaults() -> None:
    settings = settings_from_env({})
    assert settings.max_hops == DEFAULT_MAX_HOPS
    assert settings.workspace_max_hops == 0
    assert settings.workspace_window == 3600
    assert settings.budget_store == "memory"
    assert settings.budget_on_error == "allow"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("OTEL_GUARD_MAX_HOPS", "-1", "OTEL_GUARD_MAX_HOPS: max_hops: -1 is less than 0"),
        ("OTEL_GUARD_MAX_HOPS", "many", "OTEL_GUARD_MAX_HOPS: max_hops: 'many' is not an integer"),
        ("OTEL_GUARD_WORKSPACE_MAX_HOPS", "1.5", "is not an integer"),
        ("OTEL_GUARD_WORKSPACE_WINDOW_SECONDS", "0", "must be a positive, finite number of seconds"),
        ("OTEL_GUARD_BUDGET_ON_ERROR", "maybe", "budget_on_error: 'maybe' is not one of allow, refuse"),
        (
            "OTEL_GUARD_BUDGET_STORE",
            "memcached://x",
            "budget_store: 'memcached://x' is not 'memory' or a Redis URL",
        ),
        ("OTEL_GUARD_BUDGET_STORE", "redis://", "budget_store: 'redis://' is not 'memory' or a Redis URL"),
    ],
)
def test_a_bad_budget_setting_names_its_variable(variable: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        settings_from_env({variable: value})
    assert str(raised.value).startswith(f"{variable}: ")


def test_a_redis_url_is_never_repeated_with_its_password_in_an_error() -> None:
    with pytest.raises(ValueError, match="budget_store") as raised:
        settings_from_env({"OTEL_GUARD_BUDGET_STORE": "redis//:hunter2@cache:6379"})
    assert "hunter2" not in str(raised.value)


def test_a_redis_url_is_taken() -> None:
    settings = settings_from_env({"OTEL_GUARD_BUDGET_STORE": " redis://127.0.0.1:6390/2 "})
    assert settings.budget_store == "redis://127.0.0.1:6390/2"
