"""Work handed to a pool runs in the chain of its submit, never in the chain of the call that started
the pool's workers: thread pools and process pools (fork, spawn, forkserver), every way of handing
them work, pools started inside a hop and outside any.

The work (tests/core/pool_work.py) makes a hop ``worker`` in the pool and reports the chain it found
and the one it made. A process pool carries the submitting context as W3C context: the worker's
spans are in the submitter's trace, and its chain is verified as any arriving chain.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.pool
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pool_work
import pytest
from opentelemetry import context, propagate, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pool_work import seen

import otel_guard
from otel_guard import DelegationRefused, agentic, delegate
from otel_guard.guard import Delegation

pytestmark = pytest.mark.integration

WAIT = 30  # seconds: the longest any one piece of work may take
START_METHODS = ["fork", "spawn", "forkserver"]

AnyPool = Any  # an Executor or a multiprocessing.pool.Pool
Report = dict[str, Any]

# -- the pools, and each way of handing them work -------------------------------------------------------


def thread_pool_executor(**options: Any) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, **options)


def process_pool_executor(method: str) -> Callable[..., ProcessPoolExecutor]:
    return lambda **options: ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method), **options)


def process_pool(method: str) -> Callable[..., multiprocessing.pool.Pool]:
    return lambda **options: multiprocessing.get_context(method).Pool(1, **options)


def thread_pool(**options: Any) -> multiprocessing.pool.ThreadPool:
    return multiprocessing.pool.ThreadPool(1, **options)


POOLS: dict[str, Callable[..., AnyPool]] = {
    "ThreadPoolExecutor": thread_pool_executor,
    **{f"ProcessPoolExecutor-{m}": process_pool_executor(m) for m in START_METHODS},
    **{f"Pool-{m}": process_pool(m) for m in START_METHODS},
    "ThreadPool": thread_pool,
}

EXECUTOR_WAYS: dict[str, Callable[[Executor], Report]] = {
    "submit": lambda pool: pool.submit(seen, "x").result(timeout=WAIT),
    "map": lambda pool: next(iter(pool.map(seen, ["x"], timeout=WAIT))),
}

POOL_WAYS: dict[str, Callable[[multiprocessing.pool.Pool], Report]] = {
    "apply": lambda pool: pool.apply(seen, ("x",)),
    "apply_async": lambda pool: pool.apply_async(seen, ("x",)).get(WAIT),
    "map": lambda pool: pool.map(seen, ["x"])[0],
    "map_async": lambda pool: pool.map_async(seen, ["x"]).get(WAIT)[0],
    "imap": lambda pool: pool.imap(seen, ["x"]).next(WAIT),
    "imap chunked": lambda pool: next(pool.imap(seen, ["x", "y"], chunksize=2)),
    "imap_unordered": lambda pool: pool.imap_unordered(seen, ["x"]).next(WAIT),
    "starmap": lambda pool: pool.starmap(seen, [("x",)])[0],
    "starmap_async": lambda pool: pool.starmap_async(seen, [("x",)]).get(WAIT)[0],
    "apply_async, func= keyword": lambda pool: pool.apply_async(func=seen, args=("x",)).get(WAIT),
}


def ways(pool: AnyPool) -> dict[str, Callable[[Any], Report]]:
    return EXECUTOR_WAYS if isinstance(pool, Executor) else POOL_WAYS


def handed_over(pool: AnyPool) -> dict[str, Report]:
    """The work handed to ``pool`` in each way it takes work, in the current context: the reports."""
    return {name: way(pool) for name, way in ways(pool).items()}


def shut(pool: AnyPool) -> None:
    if isinstance(pool, Executor):
        pool.shutdown(wait=True, cancel_futures=True)
    else:
        pool.terminate()
        pool.join()


@contextmanager
def opened(kind: str, **options: Any) -> Iterator[AnyPool]:
    pool = POOLS[kind](**options)
    try:
        yield pool
    finally:
        shut(pool)


def trace_id() -> int:
    return trace.get_current_span().get_span_context().trace_id


def root_of(hop: Delegation) -> str:
    assert hop.chain is not None
    return hop.chain.root


# -- the finding: a worker keeps the chain of the call that started it ----------------------------------


@pytest.mark.parametrize("started", ["inside a hop", "outside any hop"])
@pytest.mark.parametrize("kind", POOLS.keys())
def test_work_runs_in_the_chain_of_its_submit_never_in_the_starters(kind: str, started: str) -> None:
    """Work from the hop the pool started in, then from no hop, then from another hop: each in its own."""
    pool = POOLS[kind]() if started == "outside any hop" else None
    try:
        with delegate("starter") as starter:
            if pool is None:
                pool = POOLS[kind]()  # an executor's worker starts with the first work handed to it
            reports = {"starter": handed_over(pool)}
            starter_trace = trace_id()
        reports["none"] = handed_over(pool)
        with delegate("later") as later:
            reports["later"] = handed_over(pool)
            later_trace = trace_id()
    finally:
        if pool is not None:
            shut(pool)

    starter_root, later_root = root_of(starter), root_of(later)
    for way, report in reports["starter"].items():
        assert (way, report["before"], report["agents"]) == (way, starter_root, ["starter", "worker"])
        assert (way, report["trace_id"]) == (way, starter_trace)  # W3C context, as a remote call has it
    for way, report in reports["none"].items():
        assert (way, report["before"], report["agents"], report["trace_id"]) == (way, None, ["worker"], None)
        assert report["root"] not in (starter_root, later_root)  # a tree of its own
    for way, report in reports["later"].items():
        assert (way, report["before"], report["agents"]) == (way, later_root, ["later", "worker"])
        assert (way, report["trace_id"]) == (way, later_trace)
    assert {r["decision"] for by_way in reports.values() for r in by_way.values()} == {"allow"}


# The pools whose workers, before carrying, kept the chain they were started in (spawned and
# forkserver workers never had it: they start from nothing).
STARTED_IN_A_CHAIN = ["ThreadPoolExecutor", "ThreadPool", "Pool-fork", "ProcessPoolExecutor-fork"]


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_worker_started_in_a_chain_that_expired_still_takes_later_work(mode: str) -> None:
    """The issue's finding: a pool started lazily in a request whose chain then outlives ``ttl``."""
    otel_guard.configure(ttl=1, mode=mode)
    pools: dict[str, AnyPool] = {}
    try:
        with delegate("starter") as starter:
            pools |= {kind: POOLS[kind]() for kind in STARTED_IN_A_CHAIN}
            first = {kind: ways(pool)["map"](pool) for kind, pool in pools.items()}  # every worker started
            stale = context.get_current()
        assert starter.chain is not None
        time.sleep(max(0.0, starter.chain.expires_at - time.time()) + 0.05)
        token = context.attach(stale)
        try:
            with pytest.raises(DelegationRefused) as expired, delegate("starter", "again"):
                pass  # the starter's chain is over: refused here, in every mode
            from_stale = {kind: ways(pool)["map"](pool) for kind, pool in pools.items()}
        finally:
            context.detach(token)
        from_none = {kind: ways(pool)["map"](pool) for kind, pool in pools.items()}
        with delegate("later") as later:
            from_later = {kind: ways(pool)["map"](pool) for kind, pool in pools.items()}
    finally:
        for pool in pools.values():
            shut(pool)

    kinds = STARTED_IN_A_CHAIN
    assert expired.value.reason == "expired"
    assert {kind: (r["agents"], r["decision"]) for kind, r in first.items()} == dict.fromkeys(
        kinds, (["starter", "worker"], "allow")
    )
    assert {
        kind: (r["before"], r["refused"], r["agents"], r["decision"]) for kind, r in from_none.items()
    } == dict.fromkeys(kinds, (None, None, ["worker"], "allow"))
    assert {kind: (r["root"], r["agents"], r["decision"]) for kind, r in from_later.items()} == dict.fromkeys(
        kinds, (root_of(later), ["later", "worker"], "allow")
    )
    # Nothing weaker: work handed over in the expired chain itself is refused there, in every mode.
    assert {kind: r["refused"] for kind, r in from_stale.items()} == dict.fromkeys(kinds, "expired")


# -- the pool's own threads and its workers' start ------------------------------------------------------


@pytest.mark.parametrize("kind", POOLS.keys())
def test_a_pools_workers_and_its_own_threads_start_in_no_chain(kind: str) -> None:
    """Started in a hop: its initializer runs in no chain, and so do the callbacks its threads run."""
    pool_work.initialized_in.clear()
    called_back: list[object] = []

    def callback(_: object) -> None:
        called_back.append(otel_guard.current_chain())

    with delegate("starter"), opened(kind, initializer=pool_work.initialize) as pool:
        if isinstance(pool, Executor):
            # The callback runs where the result is set: a process pool's own thread, a thread
            # pool's worker (the work takes long enough for the callback to be added before).
            future = pool.submit(time.sleep, 0.5)
            future.add_done_callback(callback)
            future.result(timeout=WAIT)
            noted = pool.submit(pool_work.initialized).result(timeout=WAIT)
        else:
            pool.apply_async(time.sleep, (0.1,), callback=callback).get(WAIT)  # the result handler's thread
            noted = pool.apply(pool_work.initialized)

    assert noted == {"root": None}
    assert called_back == [None]


# -- across the process boundary ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ProcessPoolExecutor-spawn", "Pool-fork"])
def test_a_loop_through_a_process_pool_is_refused_at_its_first_bounce(kind: str) -> None:
    """planner → budget (in the worker) → planner: refused in the worker, raised where it was handed over."""
    with opened(kind) as pool:

        @agentic
        def planner(task: str) -> str:
            if isinstance(pool, Executor):
                return pool.submit(pool_work.budget, task).result(timeout=WAIT)
            return pool.apply(pool_work.budget, (task,))  # type: ignore[no-any-return]

        with pytest.raises(DelegationRefused) as refused:
            planner("a trip")

    assert refused.value.reason == "cycle"
    assert refused.value.chain is not None
    assert refused.value.chain.agents == ("planner", "budget")


def test_a_signed_chain_is_verified_with_the_workers_keys(
    key: Any, make_key: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spawned worker has the keys of its environment, a forked one the process's."""
    monkeypatch.setenv("OTEL_GUARD_KEYS", key.env)
    with opened("Pool-spawn") as spawned, opened("Pool-fork") as forked:
        monkeypatch.setenv("OTEL_GUARD_KEYS", make_key("k1").env)  # the same key id, another secret
        with opened("Pool-spawn") as other, delegate("starter") as starter:
            by_spawned, by_forked, by_other = (pool.apply(seen) for pool in (spawned, forked, other))

    made = ["starter", "worker"], root_of(starter), None
    assert (by_spawned["agents"], by_spawned["root"], by_spawned["refused"]) == made
    assert (by_forked["agents"], by_forked["root"], by_forked["refused"]) == made
    assert (by_other["before"], by_other["refused"]) == (None, "bad_signature")


@pytest.fixture
def no_baggage_propagator(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``OTEL_PROPAGATORS=tracecontext`` here and in the workers: the baggage propagator left out."""
    monkeypatch.setenv("OTEL_PROPAGATORS", "tracecontext")
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())
    yield
    propagate.set_global_textmap(before)


@pytest.mark.usefixtures("no_baggage_propagator")
@pytest.mark.parametrize("kind", ["Pool-spawn", "ProcessPoolExecutor-fork"])
def test_the_chain_crosses_even_where_otel_propagators_leaves_baggage_out(kind: str) -> None:
    with opened(kind) as pool:
        ways(pool)["map"](pool)  # the worker started outside any hop
        with delegate("starter") as starter:
            report = ways(pool)["map"](pool)
            submitted_in = trace_id()

    assert (report["before"], report["agents"]) == (root_of(starter), ["starter", "worker"])
    assert report["trace_id"] == submitted_in


def test_loop_run_in_executor_with_a_process_pool_carries_the_chain() -> None:
    async def hand_over(pool: ProcessPoolExecutor) -> tuple[str, Report, Report]:
        loop = asyncio.get_running_loop()
        async with delegate("starter") as starter:
            inside = await loop.run_in_executor(pool, seen, "x")
        outside = await loop.run_in_executor(pool, seen, "y")
        return root_of(starter), inside, outside

    with opened("ProcessPoolExecutor-fork") as pool:
        root, inside, outside = asyncio.run(asyncio.wait_for(hand_over(pool), WAIT))

    assert (inside["before"], inside["agents"]) == (root, ["starter", "worker"])
    assert (outside["before"], outside["agents"]) == (None, ["worker"])


# -- from the guard's start ------------------------------------------------------------------------------

NOT_WRAPPED: dict[str, list[str]] = {"init": [], "apply_async": [], "submit": []}
WRAPPED_ONCE = {name: ["otel_guard._pools"] for name in NOT_WRAPPED}


@pytest.mark.parametrize("steps", [[], ["configure"]], ids=["the first hop", "configure"])
def test_nothing_is_patched_on_import_and_the_guards_start_turns_pools_on(
    steps: list[str], run_program: Callable[..., Any]
) -> None:
    result = run_program("pool_start.py", {"start": steps})

    assert result["after_import"] == NOT_WRAPPED
    assert result["before_hop"] == (WRAPPED_ONCE if steps else NOT_WRAPPED)
    assert result["after_hop"] == WRAPPED_ONCE
    assert result["carried"] is True  # a pool made before the guard started carries too


@pytest.mark.parametrize("disabled", ["threading", "*"])
def test_otel_python_disabled_instrumentations_leaves_pools_alone(
    disabled: str, run_program: Callable[..., Any]
) -> None:
    result = run_program("pool_start.py", {"start": []}, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled)

    assert result["after_hop"] == NOT_WRAPPED
    assert result["carried"] is False
