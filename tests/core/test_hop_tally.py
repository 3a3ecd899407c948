"""The hop tally: lock-free adds from many threads, exact counts, bounded memory, read by the SDK."""

from __future__ import annotations

import contextvars
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import Histogram, HistogramDataPoint

import otel_guard
from otel_guard import delegate
from otel_guard.telemetry import DecisionKey, HopKey, HopTally

THREADS = 8
ADDS = 20_000
DECISIONS: list[DecisionKey] = [
    ("allow", None, "gen_ai.agent.name", "planner"),
    ("refuse", "cycle", "gen_ai.agent.name", "planner"),
    ("allow", None, "gen_ai.tool.name", "search"),
    ("would_refuse", "depth", "gen_ai.agent.name", "budget"),
]


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Threads switch far more often than by default, so adds and folds interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _key(thread: int, i: int) -> HopKey:
    return DECISIONS[(thread + i) % len(DECISIONS)], 1 + (i % 5)


def _expected() -> tuple[Counter[DecisionKey], Counter[int]]:
    decisions: Counter[DecisionKey] = Counter()
    depths: Counter[int] = Counter()
    for thread in range(THREADS):
        for i in range(ADDS):
            decision, depth = _key(thread, i)
            decisions[decision] += 1
            depths[depth] += 1
    return decisions, depths


def _add_concurrently(tally: HopTally, during: Any = None) -> None:
    start = threading.Barrier(THREADS + (during is not None), timeout=10)

    def adder(thread: int) -> None:
        start.wait()
        add = tally.add
        for i in range(ADDS):
            add(_key(thread, i))

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    if during is not None:
        start.wait()
        while any(t.is_alive() for t in threads):
            during()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_counts_from_many_threads_are_exact(busy_switching: None) -> None:
    tally = HopTally()
    _add_concurrently(tally)
    decisions, depths = _expected()
    assert dict(tally.decisions()) == dict(decisions)
    assert sum(count for _, count in tally.decisions()) == THREADS * ADDS
    assert dict(tally.take_depths()) == dict(depths)
    assert tally.take_depths() == []  # depths are taken once
    assert dict(tally.decisions()) == dict(decisions)  # decisions stay cumulative


def test_no_count_is_lost_when_collections_run_during_the_adds(busy_switching: None) -> None:
    tally = HopTally()
    taken: Counter[int] = Counter()
    seen_totals: list[int] = []

    def collect() -> None:
        taken.update(dict(tally.take_depths()))
        seen_totals.append(sum(count for _, count in tally.decisions()))

    _add_concurrently(tally, during=collect)
    collect()
    decisions, depths = _expected()
    assert taken == depths
    assert dict(tally.decisions()) == dict(decisions)
    assert seen_totals == sorted(seen_totals)  # cumulative: never goes down
    assert seen_totals[-1] == THREADS * ADDS


def test_pending_keys_stay_bounded_without_any_collection() -> None:
    tally = HopTally()
    longest = 0
    for i in range(100_000):
        tally.add(_key(0, i))
        longest = max(longest, len(tally._pending))
    assert longest <= HopTally.FOLD_AT
    assert sum(count for _, count in tally.decisions()) == 100_000
    assert sum(count for _, count in tally.take_depths()) == 100_000


# -- through the SDK -----------------------------------------------------------------------------


def _depth_point(metric_reader: Any) -> tuple[int, float]:
    data = metric_reader.collect()
    for resource_metrics in data.resource_metrics if data else []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == "otel_guard.chain.depth":
                    assert isinstance(metric.data, Histogram)
                    [point] = metric.data.data_points
                    assert isinstance(point, HistogramDataPoint)
                    return point.count, point.sum
    return 0, 0.0


def _decision_count(metric_reader: Any, name: str) -> int:
    return sum(
        int(point.value)
        for attrs, point in metric_reader.points("otel_guard.decisions")
        if name in (attrs.get("gen_ai.agent.name"), attrs.get("gen_ai.tool.name"))
    )


def test_hops_in_a_thread_pool_are_all_counted(metric_reader: Any, unique: Any, busy_switching: None) -> None:
    otel_guard.configure(max_hops=0)  # 8,000 hops in one tree: more than the default budget
    planner, tool = unique("planner"), unique("search")
    tasks, calls = 32, 250
    count_before, sum_before = _depth_point(metric_reader)

    def work() -> int:
        for _ in range(calls):
            with delegate(tool, kind="tool") as hop:
                assert hop.decision == "allow"
        return calls

    with delegate(planner), ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work) for _ in range(tasks)]
        done = sum(future.result(timeout=30) for future in futures)
    assert done == tasks * calls
    assert _decision_count(metric_reader, tool) == tasks * calls
    assert _decision_count(metric_reader, planner) == 1
    count_after, sum_after = _depth_point(metric_reader)
    assert count_after - count_before == tasks * calls + 1
    assert sum_after - sum_before == 2 * tasks * calls + 1
