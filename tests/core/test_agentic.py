"""``@agentic`` (docs/spec.md §1): every call one guarded hop, on sync, async, generator and async generator
functions -- including send, throw, close and an early break."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Generator
from contextlib import aclosing
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard import DelegationRefused, agentic, current_chain, name_depth


def agents() -> tuple[str, ...]:
    chain = current_chain()
    return chain.agents if chain is not None else ()


def decisions(spans: Any, name: str) -> list[str]:
    return [s.attributes["otel_guard.decision"] for s in spans.named(name)]


# -- naming -----------------------------------------------------------------------------------------


def test_name_defaults_to_the_function_name_and_keeps_its_metadata(spans: Any) -> None:
    @agentic
    def research_agent(topic: str) -> str:
        """Research a topic."""
        return f"{topic}: {agents()}"

    assert research_agent("otters") == "otters: ('research_agent',)"
    assert research_agent.__name__ == "research_agent"
    assert research_agent.__doc__ == "Research a topic."
    assert inspect.signature(research_agent).parameters.keys() == {"topic"}
    span = spans.one("invoke_agent research_agent")
    assert "otel_guard.skill" not in span.attributes


def test_name_from_the_tool_name_attribute() -> None:
    def run(task: str) -> tuple[str, ...]:
        return agents()

    run.tool_name = "wiki_agent"  # type: ignore[attr-defined]
    assert agentic(run)("x") == ("wiki_agent",)


def test_explicit_name_and_skill(spans: Any) -> None:
    @agentic(name="planner", skill="plan")
    def make_plan() -> Any:
        return current_chain()

    chain = make_plan()
    assert chain.hops == (otel_guard.Hop("planner", "plan"),)
    assert spans.one("invoke_agent planner").attributes["otel_guard.skill"] == "plan"


def test_each_call_is_one_hop_and_the_chain_is_gone_after() -> None:
    @agentic
    def worker() -> int:
        return name_depth("worker")

    assert [worker() for _ in range(3)] == [1, 1, 1]
    assert current_chain() is None


def test_sync_refusal_stops_before_the_body() -> None:
    ran: list[str] = []

    @agentic
    def a() -> None:
        ran.append("a")
        b()

    @agentic
    def b() -> None:
        ran.append("b")
        a()

    with pytest.raises(DelegationRefused) as refused:
        a()
    assert ran == ["a", "b"]
    assert refused.value.reason == "cycle"
    assert refused.value.hop.agent == "a"


# -- coroutines -------------------------------------------------------------------------------------


async def test_async_function_is_a_hop() -> None:
    @agentic(name="budget", skill="price")
    async def price(amount: int) -> tuple[tuple[str, ...], int]:
        await asyncio.sleep(0)
        return agents(), amount

    assert inspect.iscoroutinefunction(price)
    assert await price(5) == (("budget",), 5)
    assert current_chain() is None


async def test_async_refusal_stops_before_the_body() -> None:
    entered = 0

    @agentic
    async def loop() -> None:
        nonlocal entered
        entered += 1
        await loop()

    with pytest.raises(DelegationRefused, match="cycle"):
        await loop()
    assert entered == 1


async def test_async_exception_is_recorded_and_context_restored(spans: Any) -> None:
    @agentic
    async def failing() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        await failing()
    assert current_chain() is None
    assert spans.one("invoke_agent failing").status.status_code is StatusCode.ERROR


# -- generators -------------------------------------------------------------------------------------


def test_generator_is_one_hop_whose_chain_is_seen_at_each_step_only(spans: Any) -> None:
    @agentic
    def stream(n: int) -> Generator[tuple[str, ...], None, str]:
        for _ in range(n):
            yield agents()
        return "done"

    assert inspect.isgeneratorfunction(stream)
    gen = stream(3)
    seen_between: list[tuple[str, ...]] = []
    items = []
    for item in gen:
        items.append(item)
        seen_between.append(agents())  # the consumer runs in its own context between steps
    assert items == [("stream",)] * 3
    assert seen_between == [(), (), ()]
    assert decisions(spans, "invoke_agent stream") == ["allow"]


def test_generator_return_value_and_yield_from() -> None:
    @agentic
    def inner() -> Generator[int, None, str]:
        yield 1
        return "result"

    def outer() -> Generator[int, None, str]:
        value = yield from inner()
        return value

    gen = outer()
    assert next(gen) == 1
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "result"


def test_generator_send(spans: Any) -> None:
    @agentic
    def accumulate() -> Generator[int, int, None]:
        total = 0
        while True:
            received = yield total
            assert name_depth("accumulate") == 1
            total += received

    gen = accumulate()
    assert next(gen) == 0
    assert gen.send(2) == 2
    assert gen.send(3) == 5
    gen.close()
    assert decisions(spans, "invoke_agent accumulate") == ["allow"]


def test_generator_throw_handled_inside(spans: Any) -> None:
    @agentic
    def resilient() -> Generator[str, None, None]:
        while True:
            try:
                yield "ok"
            except ValueError as exc:
                yield f"recovered from {exc} in {agents()}"

    gen = resilient()
    assert next(gen) == "ok"
    assert gen.throw(ValueError("bad")) == "recovered from bad in ('resilient',)"
    assert next(gen) == "ok"
    gen.close()
    span = spans.one("invoke_agent resilient")
    assert span.status.status_code is StatusCode.UNSET


def test_generator_throw_not_handled_ends_the_hop_with_the_error(spans: Any) -> None:
    @agentic
    def fragile() -> Generator[int, None, None]:
        yield 1
        yield 2

    gen = fragile()
    next(gen)
    with pytest.raises(RuntimeError, match="stop"):
        gen.throw(RuntimeError("stop"))
    span = spans.one("invoke_agent fragile")
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_generator_close_runs_its_cleanup_and_ends_the_hop(spans: Any) -> None:
    cleaned: list[str] = []

    @agentic
    def resource() -> Generator[int, None, None]:
        try:
            yield 1
            yield 2
        finally:
            cleaned.append("closed")

    gen = resource()
    assert next(gen) == 1
    assert spans.named("invoke_agent resource") == []  # still open
    gen.close()
    assert cleaned == ["closed"]
    assert len(spans.named("invoke_agent resource")) == 1


def test_generator_early_break_ends_the_hop(spans: Any) -> None:
    cleaned: list[str] = []

    @agentic
    def numbers() -> Generator[int, None, None]:
        try:
            yield from range(100)
        finally:
            cleaned.append("closed")

    def first_three() -> list[int]:
        taken = []
        for n in numbers():
            taken.append(n)
            if len(taken) == 3:
                break
        return taken

    assert first_three() == [0, 1, 2]
    assert cleaned == ["closed"]
    assert len(spans.named("invoke_agent numbers")) == 1
    assert current_chain() is None


def test_generator_cleanup_on_close_runs_inside_its_hop() -> None:
    seen: list[tuple[str, ...]] = []

    @agentic
    def resource() -> Generator[int, None, None]:
        try:
            yield 1
        finally:
            seen.append(agents())

    gen = resource()
    next(gen)
    gen.close()
    assert seen == [("resource",)]


def test_generator_whose_close_fails_still_ends_its_hop(spans: Any) -> None:
    @agentic
    def stubborn() -> Generator[int, None, None]:
        try:
            yield 1
        finally:
            raise OSError("cleanup failed")

    gen = stubborn()
    next(gen)
    with pytest.raises(OSError, match="cleanup failed"):
        gen.close()
    assert len(spans.named("invoke_agent stubborn")) == 1


def test_generator_is_refused_at_its_first_step_before_the_body() -> None:
    ran: list[str] = []

    @agentic
    def walker() -> Generator[int, None, None]:
        ran.append("walker")
        yield from walker()

    gen = walker()
    with pytest.raises(DelegationRefused, match="cycle"):
        next(gen)
    assert ran == ["walker"]  # the outer ran, the inner never did


def test_generator_in_observe_mode_runs_with_would_refuse(spans: Any) -> None:
    otel_guard.configure(mode="observe")

    @agentic
    def echo(depth: int) -> Generator[int, None, None]:
        yield depth
        if depth < 2:
            yield from echo(depth + 1)

    assert list(echo(0)) == [0, 1, 2]
    assert sorted(decisions(spans, "invoke_agent echo")) == ["allow", "would_refuse", "would_refuse"]


# -- async generators -------------------------------------------------------------------------------


async def test_async_generator_is_one_hop_with_its_chain_at_each_step(spans: Any) -> None:
    @agentic(name="feed", skill="news")
    async def feed(n: int) -> AsyncGenerator[tuple[str, ...], None]:
        for _ in range(n):
            await asyncio.sleep(0)
            yield agents()

    assert inspect.isasyncgenfunction(feed)
    between = []
    items = []
    async for item in feed(3):
        items.append(item)
        between.append(agents())
    assert items == [("feed",)] * 3
    assert between == [(), (), ()]
    assert decisions(spans, "invoke_agent feed") == ["allow"]


async def test_async_generator_asend_and_athrow(spans: Any) -> None:
    @agentic
    async def echo() -> AsyncGenerator[str, str]:
        reply = "start"
        while True:
            try:
                received = yield reply
                reply = f"{received} in {agents()}"
            except LookupError:
                reply = "recovered"

    gen = echo()
    assert await gen.__anext__() == "start"
    assert await gen.asend("hello") == "hello in ('echo',)"
    assert await gen.athrow(LookupError("x")) == "recovered"
    await gen.aclose()
    assert decisions(spans, "invoke_agent echo") == ["allow"]
    assert spans.one("invoke_agent echo").status.status_code is StatusCode.UNSET


async def test_async_generator_athrow_unhandled_ends_with_the_error(spans: Any) -> None:
    @agentic
    async def ticker() -> AsyncGenerator[int, None]:
        yield 1
        yield 2

    gen = ticker()
    await gen.__anext__()
    with pytest.raises(TimeoutError):
        await gen.athrow(TimeoutError())
    assert spans.one("invoke_agent ticker").status.status_code is StatusCode.ERROR


async def test_async_generator_aclose_and_early_break_end_the_hop(spans: Any) -> None:
    cleaned: list[str] = []

    @agentic
    async def numbers() -> AsyncGenerator[int, None]:
        try:
            for n in range(100):
                yield n
        finally:
            cleaned.append("closed")

    async with aclosing(numbers()) as gen:
        async for n in gen:
            if n == 2:
                break
    assert cleaned == ["closed"]
    assert len(spans.named("invoke_agent numbers")) == 1
    assert current_chain() is None


async def test_async_generator_cleanup_on_aclose_runs_inside_its_hop() -> None:
    seen: list[tuple[str, ...]] = []

    @agentic
    async def resource() -> AsyncGenerator[int, None]:
        try:
            yield 1
        finally:
            seen.append(agents())

    gen = resource()
    await gen.__anext__()
    await gen.aclose()
    assert seen == [("resource",)]


async def test_async_generator_whose_aclose_fails_still_ends_its_hop(spans: Any) -> None:
    @agentic
    async def stubborn() -> AsyncGenerator[int, None]:
        try:
            yield 1
        finally:
            raise OSError("cleanup failed")

    gen = stubborn()
    await gen.__anext__()
    with pytest.raises(OSError, match="cleanup failed"):
        await gen.aclose()
    assert len(spans.named("invoke_agent stubborn")) == 1


async def test_async_generator_is_refused_at_its_first_step() -> None:
    ran: list[str] = []

    @agentic
    async def walker() -> AsyncGenerator[int, None]:
        ran.append("walker")
        async for item in walker():
            yield item
        yield 0

    with pytest.raises(DelegationRefused, match="cycle"):
        async for _ in walker():
            pass
    assert ran == ["walker"]


async def test_async_generators_in_parallel_tasks_keep_their_own_chains() -> None:
    otel_guard.configure(cycle_rule="agent")

    @agentic
    async def branch(label: str) -> AsyncGenerator[tuple[str, ...], None]:
        for _ in range(3):
            await asyncio.sleep(0)
            yield agents()

    @agentic
    async def planner() -> list[list[tuple[str, ...]]]:
        async def drain(label: str) -> list[tuple[str, ...]]:
            return [item async for item in branch(label)]

        return list(await asyncio.gather(drain("a"), drain("b")))

    assert await planner() == [[("planner", "branch")] * 3] * 2
