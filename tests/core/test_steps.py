"""The one mechanism behind every hop around a generator: a context around each step, never across one.

These tests drive :mod:`otel_guard._steps` directly with a marker value in the OpenTelemetry context
(no hop, no span), recording every call of ``done``: it must be called exactly once on every path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any

import pytest
from opentelemetry import context

from otel_guard._steps import Done, async_generator_in_context, generator_in_context

KEY = "otel_guard.test_steps"


def where() -> object:
    """The marker in the current context: ``"inside"`` within a step, ``None`` outside."""
    return context.get_value(KEY)


class Steps:
    """An ``enter`` for the steps: counts entries and records every call of ``done``."""

    def __init__(self) -> None:
        self.entered = 0
        self.done: list[BaseException | None] = []

    def __call__(self) -> tuple[context.Context, Done]:
        self.entered += 1
        return context.set_value(KEY, "inside"), self.done.append

    async def aenter(self) -> tuple[context.Context, Done]:
        """The ``enter`` of an async generator: awaited (it gives the loop a turn first)."""
        await asyncio.sleep(0)
        return self()

    @property
    def outcome(self) -> BaseException | None:
        """What the steps ended with; fails unless ``done`` was called exactly once."""
        assert len(self.done) == 1, f"done called {len(self.done)} times: {self.done}"
        return self.done[0]


# -- sync ------------------------------------------------------------------------------------------


def test_each_step_runs_inside_the_context_and_the_consumer_outside() -> None:
    def count(n: int) -> Generator[tuple[int, object], None, str]:
        for i in range(n):
            yield i, where()
        return f"counted {n} {where()}"

    steps = Steps()
    gen = generator_in_context(steps, count)(3)
    assert steps.entered == 0  # nothing runs before the first step
    seen, between = [], []
    for _ in range(3):
        seen.append(next(gen))
        between.append(where())
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert seen == [(0, "inside"), (1, "inside"), (2, "inside")]
    assert between == [None, None, None]
    assert stop.value.value == "counted 3 inside"  # the return value is passed on
    assert steps.entered == 1
    assert steps.outcome is None


def test_make_is_called_inside_the_context_with_the_arguments() -> None:
    made: list[tuple[object, tuple[Any, ...], dict[str, Any]]] = []

    def make(*args: Any, **kwargs: Any) -> Iterator[int]:
        made.append((where(), args, kwargs))
        return iter([1])

    steps = Steps()
    assert list(generator_in_context(steps, make)(1, 2, key="value")) == [1]
    assert made == [("inside", (1, 2), {"key": "value"})]
    assert steps.outcome is None


def test_send_is_forwarded() -> None:
    def accumulate() -> Generator[tuple[int, object], int, None]:
        total = 0
        while True:
            total += yield total, where()

    steps = Steps()
    gen = generator_in_context(steps, accumulate)()
    assert next(gen) == (0, "inside")
    assert gen.send(2) == (2, "inside")
    assert gen.send(3) == (5, "inside")
    assert where() is None
    gen.close()
    assert steps.outcome is None


def test_throw_handled_by_the_inner_generator_continues_the_steps() -> None:
    def resilient() -> Generator[object, None, None]:
        while True:
            try:
                yield "ok"
            except ValueError as exc:
                yield f"recovered from {exc} {where()}"

    steps = Steps()
    gen = generator_in_context(steps, resilient)()
    assert next(gen) == "ok"
    assert gen.throw(ValueError("bad")) == "recovered from bad inside"
    assert next(gen) == "ok"
    assert steps.done == []
    gen.close()
    assert steps.outcome is None


def test_throw_not_handled_ends_the_steps_with_the_error() -> None:
    cleaned_up_in: list[object] = []

    def fragile() -> Generator[int, None, None]:
        try:
            yield 1
            yield 2
        finally:
            cleaned_up_in.append(where())

    steps = Steps()
    gen = generator_in_context(steps, fragile)()
    next(gen)
    error = RuntimeError("stop")
    with pytest.raises(RuntimeError, match="stop"):
        gen.throw(error)
    assert cleaned_up_in == ["inside"]
    assert steps.outcome is error
    assert where() is None


def test_throw_handled_by_returning_ends_the_steps_as_a_success() -> None:
    def stoppable() -> Generator[int, None, str]:
        try:
            yield 1
        except KeyboardInterrupt:
            return "stopped"
        return "ran out"

    steps = Steps()
    gen = generator_in_context(steps, stoppable)()
    next(gen)
    with pytest.raises(StopIteration) as stop:
        gen.throw(KeyboardInterrupt())
    assert stop.value.value == "stopped"
    assert steps.outcome is None


def test_early_break_closes_the_inner_generator_inside_the_context() -> None:
    cleaned_up_in: list[object] = []

    def endless() -> Generator[int, None, None]:
        try:
            while True:
                yield 1
        finally:
            cleaned_up_in.append(where())

    steps = Steps()
    gen = generator_in_context(steps, endless)()
    for _ in gen:
        break
    assert steps.done == []  # the consumer still holds the generator
    gen.close()
    assert cleaned_up_in == ["inside"]
    assert steps.outcome is None
    gen.close()  # closing again does nothing more
    assert len(steps.done) == 1


def test_a_failing_close_ends_the_steps_with_its_error() -> None:
    def stubborn() -> Generator[int, None, None]:
        try:
            yield 1
        finally:
            raise OSError("cannot release")

    steps = Steps()
    gen = generator_in_context(steps, stubborn)()
    next(gen)
    with pytest.raises(OSError, match="cannot release"):
        gen.close()
    assert isinstance(steps.outcome, OSError)
    assert where() is None


def test_a_failing_step_ends_the_steps_with_its_error() -> None:
    def failing() -> Generator[int, None, None]:
        yield 1
        raise KeyError("missing")

    steps = Steps()
    gen = generator_in_context(steps, failing)()
    assert next(gen) == 1
    with pytest.raises(KeyError):
        next(gen)
    assert isinstance(steps.outcome, KeyError)
    assert where() is None


def test_make_failing_ends_the_steps_with_its_error() -> None:
    def make() -> Iterator[int]:
        raise ConnectionError(f"no stream {where()}")

    steps = Steps()
    with pytest.raises(ConnectionError, match="no stream inside"):
        next(generator_in_context(steps, make)())
    assert isinstance(steps.outcome, ConnectionError)
    assert where() is None


def test_enter_failing_runs_nothing() -> None:
    made: list[object] = []

    def refuse() -> tuple[context.Context, Done]:
        raise RecursionError("refused")

    def make() -> Iterator[int]:
        made.append(True)
        return iter([1])

    with pytest.raises(RecursionError, match="refused"):
        next(generator_in_context(refuse, make)())
    assert made == []


class Countdown:
    """A plain iterator (no send, no throw) with a ``close`` that records the context it ran in."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.closed_in: list[object] = []

    def __iter__(self) -> Iterator[tuple[int, object]]:
        return self

    def __next__(self) -> tuple[int, object]:
        if self.n == 0:
            raise StopIteration
        self.n -= 1
        return self.n, where()

    def close(self) -> None:
        self.closed_in.append(where())


def test_plain_iterator_steps_inside_the_context() -> None:
    steps = Steps()
    assert list(generator_in_context(steps, Countdown)(2)) == [(1, "inside"), (0, "inside")]
    assert steps.outcome is None


def test_plain_iterator_is_closed_inside_the_context_on_early_exit() -> None:
    inner = Countdown(5)
    steps = Steps()
    gen = generator_in_context(steps, lambda: inner)()
    next(gen)
    gen.close()
    assert inner.closed_in == ["inside"]
    assert steps.outcome is None


def test_throw_into_a_plain_iterator_closes_it_and_is_raised() -> None:
    inner = Countdown(5)
    steps = Steps()
    gen = generator_in_context(steps, lambda: inner)()
    next(gen)
    error = ValueError("thrown")
    with pytest.raises(ValueError, match="thrown"):
        gen.throw(error)
    assert inner.closed_in == ["inside"]
    assert steps.outcome is error


def test_a_value_sent_into_a_plain_iterator_closes_it_and_raises_a_clear_error() -> None:
    inner = Countdown(5)
    steps = Steps()
    gen = generator_in_context(steps, lambda: inner)()
    next(gen)
    assert gen.send(None) == (3, "inside")  # None is a plain next()
    with pytest.raises(TypeError, match=r"cannot send 7 into Countdown, a plain iterator"):
        gen.send(7)
    assert inner.closed_in == ["inside"]
    assert isinstance(steps.outcome, TypeError)


def test_a_plain_iterator_without_close_ends_on_early_exit() -> None:
    steps = Steps()
    gen = generator_in_context(steps, lambda: iter(range(5)))()
    assert next(gen) == 0
    gen.close()
    assert steps.outcome is None


# -- async -----------------------------------------------------------------------------------------


async def test_async_each_step_runs_inside_the_context_and_the_consumer_outside() -> None:
    made_in: list[object] = []

    async def count(n: int) -> AsyncGenerator[tuple[int, object], None]:
        for i in range(n):
            yield i, where()

    def make(n: int) -> AsyncGenerator[tuple[int, object], None]:
        made_in.append(where())
        return count(n)

    steps = Steps()
    gen = async_generator_in_context(steps.aenter, make)(3)
    assert steps.entered == 0
    seen, between = [], []
    async for item in gen:
        seen.append(item)
        between.append(where())
    assert seen == [(0, "inside"), (1, "inside"), (2, "inside")]
    assert between == [None, None, None]
    assert made_in == ["inside"]
    assert steps.outcome is None


async def test_async_asend_and_athrow_handled_are_forwarded() -> None:
    async def echo() -> AsyncGenerator[object, str]:
        received = yield "ready"
        while True:
            try:
                received = yield f"{received} {where()}"
            except LookupError:
                received = yield f"recovered {where()}"

    steps = Steps()
    gen = async_generator_in_context(steps.aenter, echo)()
    assert await anext(gen) == "ready"
    assert await gen.asend("hello") == "hello inside"
    assert await gen.athrow(LookupError("x")) == "recovered inside"
    assert where() is None
    assert steps.done == []
    await gen.aclose()
    assert steps.outcome is None


async def test_async_athrow_not_handled_ends_the_steps_with_the_error() -> None:
    cleaned_up_in: list[object] = []

    async def fragile() -> AsyncGenerator[int, None]:
        try:
            yield 1
            yield 2
        finally:
            cleaned_up_in.append(where())

    steps = Steps()
    gen = async_generator_in_context(steps.aenter, fragile)()
    await anext(gen)
    error = TimeoutError()
    with pytest.raises(TimeoutError):
        await gen.athrow(error)
    assert cleaned_up_in == ["inside"]
    assert steps.outcome is error


async def test_async_early_break_and_aclose_close_the_inner_generator_inside_the_context() -> None:
    cleaned_up_in: list[object] = []

    async def endless() -> AsyncGenerator[int, None]:
        try:
            while True:
                yield 1
        finally:
            cleaned_up_in.append(where())

    steps = Steps()
    gen = async_generator_in_context(steps.aenter, endless)()
    async for _ in gen:
        break
    assert steps.done == []
    await gen.aclose()
    assert cleaned_up_in == ["inside"]
    assert steps.outcome is None
    await gen.aclose()
    assert len(steps.done) == 1


async def test_async_a_failing_aclose_ends_the_steps_with_its_error() -> None:
    async def stubborn() -> AsyncGenerator[int, None]:
        try:
            yield 1
        finally:
            raise OSError("cannot release")

    steps = Steps()
    gen = async_generator_in_context(steps.aenter, stubborn)()
    await anext(gen)
    with pytest.raises(OSError, match="cannot release"):
        await gen.aclose()
    assert isinstance(steps.outcome, OSError)


async def test_async_a_failing_step_ends_the_steps_with_its_error() -> None:
    async def failing() -> AsyncGenerator[int, None]:
        yield 1
        raise KeyError("missing")

    steps = Steps()
    with pytest.raises(KeyError):
        async for _ in async_generator_in_context(steps.aenter, failing)():
            pass
    assert isinstance(steps.outcome, KeyError)
    assert where() is None


async def test_async_make_failing_ends_the_steps_with_its_error() -> None:
    def make() -> AsyncIterator[int]:
        raise ConnectionError(f"no stream {where()}")

    steps = Steps()
    with pytest.raises(ConnectionError, match="no stream inside"):
        await anext(async_generator_in_context(steps.aenter, make)())
    assert isinstance(steps.outcome, ConnectionError)


async def test_async_enter_failing_runs_nothing() -> None:
    made: list[object] = []

    async def refuse() -> tuple[context.Context, Done]:
        raise RecursionError("refused")

    def make() -> AsyncIterator[int]:
        made.append(True)
        raise AssertionError("never called")

    with pytest.raises(RecursionError, match="refused"):
        await anext(async_generator_in_context(refuse, make)())
    assert made == []


class AsyncCountdown:
    """A plain async iterator (no asend, no athrow) with an ``aclose`` recording its context."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.closed_in: list[object] = []

    def __aiter__(self) -> AsyncIterator[tuple[int, object]]:
        return self

    async def __anext__(self) -> tuple[int, object]:
        if self.n == 0:
            raise StopAsyncIteration
        self.n -= 1
        return self.n, where()

    async def aclose(self) -> None:
        self.closed_in.append(where())


async def test_async_plain_iterator_steps_inside_the_context_and_closes_inside_it() -> None:
    steps = Steps()
    assert [item async for item in async_generator_in_context(steps.aenter, AsyncCountdown)(2)] == [
        (1, "inside"),
        (0, "inside"),
    ]
    assert steps.outcome is None

    inner = AsyncCountdown(5)
    steps = Steps()
    gen = async_generator_in_context(steps.aenter, lambda: inner)()
    await anext(gen)
    await gen.aclose()
    assert inner.closed_in == ["inside"]
    assert steps.outcome is None


async def test_async_athrow_into_a_plain_iterator_closes_it_and_is_raised() -> None:
    inner = AsyncCountdown(5)
    steps = Steps()
    gen = async_generator_in_context(steps.aenter, lambda: inner)()
    await anext(gen)
    error = ValueError("thrown")
    with pytest.raises(ValueError, match="thrown"):
        await gen.athrow(error)
    assert inner.closed_in == ["inside"]
    assert steps.outcome is error


async def test_async_a_value_sent_into_a_plain_iterator_closes_it_and_raises_a_clear_error() -> None:
    inner = AsyncCountdown(5)
    steps = Steps()
    gen = async_generator_in_context(steps.aenter, lambda: inner)()
    await anext(gen)
    with pytest.raises(TypeError, match=r"cannot send 'x' into AsyncCountdown, a plain iterator"):
        await gen.asend("x")
    assert inner.closed_in == ["inside"]
    assert isinstance(steps.outcome, TypeError)


# -- moving into a context a step made ---------------------------------------------------------------


def test_the_steps_after_moved_gives_a_context_run_in_it() -> None:
    """``moved`` is asked after each step; once it answers, the later steps run in its context."""
    later = context.set_value(KEY, "moved")
    asked: list[int] = []

    def moved() -> context.Context | None:
        asked.append(len(asked))
        return later if len(asked) == 2 else None

    def count() -> Iterator[object]:
        return (where() for _ in range(4))

    steps = Steps()
    seen = list(generator_in_context(steps, count, moved)())
    assert seen == ["inside", "inside", "moved", "moved"]
    assert len(asked) == 2  # never asked again once it moved
    assert where() is None
    assert steps.outcome is None


async def test_the_async_steps_after_moved_gives_a_context_run_in_it() -> None:
    later = context.set_value(KEY, "moved")
    answers = iter([None, later])

    async def count() -> AsyncIterator[object]:
        for _ in range(3):
            yield where()

    steps = Steps()
    seen = [item async for item in async_generator_in_context(steps.aenter, count, lambda: next(answers))()]
    assert seen == ["inside", "inside", "moved"]
    assert where() is None
    assert steps.outcome is None
