"""The delegation chain crosses threads: a loop through a thread is refused at its first bounce, a
tree's budget counts the hops of all its threads, and threads started outside any hop share nothing.

Carrying starts with the guard (the session's settings are read before the first test), so the tests
in this process see it on; the cases that need a fresh interpreter (nothing patched on import, each
way the guard starts, the off switch) run ``programs/thread_loop.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

import otel_guard
from otel_guard import DelegationRefused, agentic, current_chain, delegate
from otel_guard._threads import carry_context

T = TypeVar("T")
THREADS = "otel_guard._threads"

# -- ways to run a call in another thread -----------------------------------------------------------


def in_pool(fn: Callable[[], T]) -> T:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=30)


def _in(thread_class: type[threading.Thread], fn: Callable[[], T]) -> T:
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = thread_class(target=run)
    thread.start()
    thread.join(timeout=30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


class OwnRun(threading.Thread):
    """A thread with a ``run`` of its own, not calling ``Thread.run``."""

    def __init__(self, target: Callable[[], None]) -> None:
        super().__init__()
        self.body = target

    def run(self) -> None:
        self.body()


def in_thread(fn: Callable[[], T]) -> T:
    return _in(threading.Thread, fn)


def in_subclass(fn: Callable[[], T]) -> T:
    return _in(OwnRun, fn)


def in_to_thread(fn: Callable[[], T]) -> T:
    return asyncio.run(asyncio.to_thread(fn))


def in_executor(fn: Callable[[], T]) -> T:
    async def hand_off() -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    return asyncio.run(hand_off())


WAYS = {
    "ThreadPoolExecutor.submit": in_pool,
    "threading.Thread": in_thread,
    "Thread subclass with its own run": in_subclass,
    "asyncio.to_thread": in_to_thread,
    "loop.run_in_executor": in_executor,
}


def loop_through(hand_off: Callable[[Callable[[], str]], str]) -> tuple[list[int], DelegationRefused]:
    """planner → budget (in another thread) → planner; stops itself at 5 rounds if nothing refuses."""
    runs: list[int] = []

    @agentic
    def planner() -> str:
        runs.append(threading.get_ident())
        return hand_off(budget)

    @agentic
    def budget() -> str:
        return "ran away" if len(runs) >= 5 else planner()

    with pytest.raises(DelegationRefused) as refused:
        planner()
    return runs, refused.value


# -- the loop -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hand_off", WAYS.values(), ids=WAYS.keys())
def test_a_loop_through_a_thread_is_refused_at_its_first_bounce(
    hand_off: Callable[[Callable[[], str]], str], spans: Any
) -> None:
    runs, refused = loop_through(hand_off)

    assert len(runs) == 1  # planner's body ran once: the second entry was refused
    assert refused.reason == "cycle"
    assert refused.chain is not None
    assert refused.chain.agents == ("planner", "budget")
    first, second = spans.named("invoke_agent planner")[::-1]  # finished last, started first
    (budget,) = spans.named("invoke_agent budget")
    assert [s.attributes["otel_guard.decision"] for s in (first, budget, second)] == [
        "allow",
        "allow",
        "refuse",
    ]
    # One trace across the threads: budget under planner's span, the refused hop under budget's.
    assert budget.parent.span_id == first.context.span_id
    assert second.parent.span_id == budget.context.span_id
    assert len({s.context.trace_id for s in (first, budget, second)}) == 1


def test_a_tree_budget_counts_the_hops_of_every_thread(spans: Any) -> None:
    otel_guard.configure(max_hops=3)
    start = threading.Barrier(3, timeout=30)

    def worker(i: int) -> str | DelegationRefused:
        start.wait()  # the three race for the tree's last two hops
        try:
            with delegate("worker", f"part{i}"):
                chain = current_chain()
                assert chain is not None
                return chain.root
        except DelegationRefused as exc:
            return exc

    @agentic
    def planner() -> tuple[str, list[str | DelegationRefused]]:
        chain = current_chain()
        assert chain is not None
        with ThreadPoolExecutor(3) as pool:
            return chain.root, list(pool.map(worker, range(3)))

    root, results = planner()

    refusals = [r for r in results if isinstance(r, DelegationRefused)]
    assert len(refusals) == 1  # the 4th hop of the tree
    assert refusals[0].reason == "budget"
    assert sorted(r for r in results if isinstance(r, str)) == [root, root]
    assert spans.one("invoke_agent planner").attributes["otel_guard.budget.hops"] == 1
    workers = spans.named("invoke_agent worker")
    allowed = [s for s in workers if s.attributes["otel_guard.decision"] == "allow"]
    assert sorted(s.attributes["otel_guard.budget.hops"] for s in allowed) == [2, 3]
    (refused,) = (s for s in workers if s.attributes["otel_guard.decision"] == "refuse")
    assert refused.attributes["otel_guard.budget.exhausted"] == "hops"
    assert {s.attributes["otel_guard.chain.root"] for s in workers} == {root}


# -- what is not carried ------------------------------------------------------------------------------


def test_calls_in_threads_started_outside_any_hop_do_not_share_a_chain() -> None:
    inside = threading.Barrier(2, timeout=30)

    @agentic
    def planner() -> tuple[tuple[str, ...], str]:
        inside.wait()  # both calls are inside their hop at the same moment
        chain = current_chain()
        assert chain is not None
        return chain.agents, chain.root

    results: list[tuple[tuple[str, ...], str]] = []
    threads = [threading.Thread(target=lambda: results.append(planner())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert [agents for agents, _ in results] == [("planner",), ("planner",)]
    assert results[0][1] != results[1][1]  # two trees


def test_a_pool_thread_started_inside_a_hop_does_not_keep_its_chain() -> None:
    with ThreadPoolExecutor(1) as pool:

        @agentic
        def planner() -> Any:
            return pool.submit(current_chain).result(timeout=30)  # the pool's thread starts here

        assert planner().agents == ("planner",)
        assert pool.submit(current_chain).result(timeout=30) is None


@pytest.mark.parametrize("start", ["start", "contextvars.Context().run(start)"])
def test_a_long_lived_worker_started_inside_a_hop_keeps_its_chain_unless_started_empty(start: str) -> None:
    """A thread is a branch of the hop that starts it; one started in an empty context is not."""
    work: queue.Queue[int | None] = queue.Queue()
    seen: list[tuple[str, ...] | None] = []

    def serve() -> None:
        while work.get(timeout=30) is not None:
            chain = current_chain()
            seen.append(chain.agents if chain is not None else None)

    with delegate("planner"):
        worker = threading.Thread(target=serve)
        if start == "start":
            worker.start()
        else:
            contextvars.Context().run(worker.start)
    for item in (1, 2, None):
        work.put(item)
    worker.join(timeout=30)

    assert seen == ([("planner",)] * 2 if start == "start" else [None, None])


def test_a_thread_that_has_run_holds_no_context() -> None:
    with delegate("planner"):
        thread = threading.Thread(target=current_chain)
        thread.start()
    thread.join(timeout=30)

    assert "run" not in vars(thread)


# -- turned on once -----------------------------------------------------------------------------------


def test_starting_again_wraps_nothing_twice(spans: Any) -> None:
    carry_context()
    carry_context()
    otel_guard.configure(max_depth=8)
    otel_guard.settings.reset_settings()

    for method in (threading.Thread.__dict__["start"], ThreadPoolExecutor.__dict__["submit"]):
        assert method._self_wrapper.__module__ == THREADS
        assert not hasattr(method.__wrapped__, "__wrapped__")  # one layer
    runs, _ = loop_through(in_pool)
    assert len(runs) == 1
    assert [s.attributes["otel_guard.decision"] for s in spans.named("invoke_agent planner")] == [
        "refuse",
        "allow",
    ]


def test_nothing_is_patched_on_import_and_the_first_hop_turns_it_on(run_program: Callable[..., Any]) -> None:
    result = run_program("thread_loop.py", {"start": []})

    assert result["after_import"] == {"start": [], "submit": []}
    assert result["before_loop"] == {"start": [], "submit": []}
    assert result["after_loop"] == {"start": [THREADS], "submit": [THREADS]}
    assert (result["runs"], result["refused"]) == (1, "cycle")


@pytest.mark.parametrize(
    "steps",
    [["configure"], ["instrument", "instrument"], ["instrument", "uninstrument"]],
    ids=["configure", "instrumented twice", "instrumented, then uninstrumented"],
)
def test_each_way_the_guard_starts_turns_it_on_once(
    steps: list[str], run_program: Callable[..., Any]
) -> None:
    result = run_program("thread_loop.py", {"start": steps})

    once = {"start": [THREADS], "submit": [THREADS]}
    assert result["after_import"] == {"start": [], "submit": []}
    assert result["before_loop"] == once  # before any hop, and not undone by uninstrument
    assert result["after_loop"] == once
    assert (result["runs"], result["refused"]) == (1, "cycle")


@pytest.mark.parametrize("disabled", ["threading", "requests, threading", "*"])
def test_otel_python_disabled_instrumentations_leaves_threads_alone(
    disabled: str, run_program: Callable[..., Any]
) -> None:
    result = run_program("thread_loop.py", {"start": []}, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled)

    assert result["after_loop"] == {"start": [], "submit": []}
    assert (result["runs"], result["refused"]) == (5, None)  # the loop ran until it stopped itself
