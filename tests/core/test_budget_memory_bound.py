"""The memory store holds a bounded number of counts (issue 41.5).

Before, it kept a count for every fresh tree for its whole ``ttl``, with no cap: 100,000 anonymous
requests at a guarded service made 100,000 entries in 4 s. Now it holds at most ``MAX_ENTRIES``; past
it the oldest tree counts not used since go first, each drop counted in
``otel_guard.budget.store_evictions``, and a tree in use keeps its count while older ones exist, so a
flood of fresh trees does not hand a looping tree its budget back.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context

import otel_guard
import otel_guard.budget
from otel_guard import DelegationRefused, delegate
from otel_guard.budget import HOPS, WORKSPACE_HOPS, MemoryStore, Meter
from otel_guard.budget.memory import MAX_ENTRIES, METRIC_STORE_EVICTIONS
from otel_guard.settings import current_settings

NOW = 1_000.0
EXPIRES = NOW + 300


def evictions(metric_reader: Any) -> int:
    """The evictions counted so far (cumulative for the session)."""
    return sum(int(point.value) for _, point in metric_reader.points(METRIC_STORE_EVICTIONS))


def tree(index: int, limit: int = 10) -> Meter:
    return Meter(f"tree:ws:root{index}", limit, EXPIRES, HOPS)


def test_the_default_bound_holds_and_counts_each_drop(metric_reader: Any) -> None:
    """The finding: one fresh tree a request, many more than the bound within one ``ttl``."""
    store = MemoryStore()
    before = evictions(metric_reader)
    extra = 500
    for index in range(MAX_ENTRIES + extra):
        assert store.take([tree(index)], NOW) == (1,)
    assert len(store) == MAX_ENTRIES
    assert evictions(metric_reader) - before == extra
    assert [store.used(tree(i).key, NOW) for i in range(extra)] == [0] * extra  # the oldest went
    assert store.used(tree(extra).key, NOW) == 1
    assert store.used(tree(MAX_ENTRIES + extra - 1).key, NOW) == 1


def test_the_oldest_trees_go_first() -> None:
    store = MemoryStore(max_entries=100)
    for index in range(250):
        store.take([tree(index)], NOW)
    assert len(store) == 100
    kept = [index for index in range(250) if store.used(tree(index).key, NOW)]
    assert kept == list(range(150, 250))


def test_a_tree_in_use_is_not_dropped_while_older_ones_exist(metric_reader: Any) -> None:
    store = MemoryStore(max_entries=100)
    assert store.take([tree(0, limit=3)], NOW) == (1,)  # the oldest tree, still at work
    for index in range(1, 100):
        store.take([tree(index)], NOW)
    assert store.take([tree(0, limit=3)], NOW) == (2,)
    before = evictions(metric_reader)
    store.take([tree(100)], NOW)  # the store is full: one count goes
    assert evictions(metric_reader) - before == 1
    assert store.used(tree(1).key, NOW) == 0  # the oldest not in use
    assert store.used(tree(0).key, NOW) == 2
    assert store.take([tree(0, limit=3)], NOW) == (3,)
    assert store.take([tree(0, limit=3)], NOW) == 0  # its budget is spent, flood or not


def test_an_expired_count_makes_room_without_a_drop(metric_reader: Any) -> None:
    store = MemoryStore(max_entries=10)
    for index in range(10):
        store.take([Meter(f"tree:ws:old{index}", 10, NOW + 1, HOPS)], NOW)
    before = evictions(metric_reader)
    for index in range(10):
        store.take([tree(index)], NOW + 2)
    assert len(store) == 10
    assert evictions(metric_reader) == before


def test_the_workspace_count_and_the_takes_own_counts_are_never_dropped(metric_reader: Any) -> None:
    store = MemoryStore(max_entries=50)
    workspace = Meter("workspace:ws:60:1", 1000, EXPIRES, WORKSPACE_HOPS)
    for index in range(200):
        assert store.take([tree(index), workspace], NOW) == (1, index + 1)
    assert len(store) == 50
    assert store.used(workspace.key, NOW) == 200  # a flood of trees never resets the workspace's cap
    assert store.used(tree(199).key, NOW) == 1


def test_a_flood_of_fresh_trees_does_not_give_a_looping_tree_its_budget_back(
    monkeypatch: pytest.MonkeyPatch, metric_reader: Any
) -> None:
    """Through the guard: between each two hops of a tree at work, 150 anonymous hops (each a fresh
    tree) in a store of 200 counts. The flood's trees are dropped, the working tree keeps its count
    (it takes again before a whole store of newer trees has passed it), so its ``max_hops`` holds."""
    monkeypatch.setattr(otel_guard.budget, "MemoryStore", lambda: MemoryStore(max_entries=200))
    otel_guard.configure(max_hops=5)
    before = evictions(metric_reader)
    outcomes = []
    with delegate("planner"):  # hop 1 of its tree's 5
        for _ in range(10):
            for index in range(150):  # elsewhere in the process: anonymous requests
                anonymous = context.attach(context.Context())  # no chain: a fresh tree each
                try:
                    with delegate(f"anonymous{index}"):
                        pass
                finally:
                    context.detach(anonymous)
            try:
                with delegate("worker"):
                    outcomes.append("allow")
            except DelegationRefused as err:
                outcomes.append(err.reason)
    assert outcomes == ["allow"] * 4 + ["budget"] * 6
    store = otel_guard.budget.store_for(current_settings())
    assert isinstance(store, MemoryStore)
    assert len(store) == 200
    assert evictions(metric_reader) - before == 10 * 150 + 1 - 200
