"""The memory store's ``take_hop`` (a hop counted against its tree's hops alone) counts as ``take`` does.

A nested hop with ``max_hops`` on takes its tree's count through ``take_hop``, which makes no tuple
and no meter: the same program of takes through either (trees new, used, expired, past their limit,
at ``MAX_COUNT``, evicted from a full store) must give the same answers and leave the same counts.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_guard.budget import HOPS, MAX_COUNT, MemoryStore, Meter

TREES = 6
LIMITS = (0, 1, 2, 3, MAX_COUNT, MAX_COUNT + 5)

take_steps = st.lists(
    st.tuples(
        st.integers(0, TREES - 1),  # which tree
        st.sampled_from(LIMITS),  # its limit at this take
        st.integers(0, 3),  # how far the clock moves first
        st.integers(0, 40),  # its count's expiry, after the clock's start
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(take_steps)
def test_take_hop_answers_and_counts_as_take(steps: list[tuple[int, int, int, int]]) -> None:
    by_take, by_hop = MemoryStore(max_entries=4), MemoryStore(max_entries=4)
    now = 0.0
    for tree, limit, later, expires in steps:
        now += later
        meter = Meter(f"tree:ws:root{tree}", limit, float(expires), HOPS)
        taken = by_take.take([meter], now)
        count = by_hop.take_hop((meter.key, meter.limit, meter.expires_at), now)
        assert count == (-1 if taken == 0 else taken[0])  # type: ignore[index]
        for other in range(TREES):
            key = f"tree:ws:root{other}"
            assert by_hop.used(key, now) == by_take.used(key, now)
        assert len(by_hop) == len(by_take)


def test_a_count_at_max_count_stays_there() -> None:
    """With no limit, a count stops at ``MAX_COUNT`` (where the Redis store's Lua numbers stop being
    exact), through ``take_hop`` as through ``take``."""
    store = MemoryStore()
    key = "tree:ws:full"
    store.take([Meter(key, 0, 100.0, HOPS, MAX_COUNT - 1)], 0.0)
    assert store.take_hop((key, 0, 100.0), 0.0) == MAX_COUNT
    assert store.take_hop((key, 0, 100.0), 0.0) == MAX_COUNT
    assert store.take_hop((key, MAX_COUNT, 100.0), 0.0) == -1  # at a limit of MAX_COUNT: spent
    assert store.used(key, 0.0) == MAX_COUNT


def test_a_spent_tree_takes_nothing_and_an_expired_one_starts_again() -> None:
    store = MemoryStore()
    key = "tree:ws:small"
    assert [store.take_hop((key, 2, 10.0), 1.0) for _ in range(3)] == [1, 2, -1]
    assert store.used(key, 1.0) == 2
    assert store.take_hop((key, 2, 30.0), 10.0) == 1  # expired at 10: a new count, a new expiry
    assert store.used(key, 20.0) == 1
