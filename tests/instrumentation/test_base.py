"""What the runtime instrumentors' wrappers share: stepping aside under suppression, a call inside a hop.

``unless_suppressed`` and ``call_in_hop`` / ``acall_in_hop`` stand in for code every runtime wrote out
by hand; these pin the behaviour the runtimes' own tests rely on: the patched call unchanged while
suppressed, the hop's context around the call only, the hop's span ended with the call's outcome,
and the two kinds of refusal (on entry: ``refused`` answers; from the body: it passes on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard import DelegationRefused, current_chain, delegate
from otel_guard.instrumentation._base import acall_in_hop, call_in_hop, unless_suppressed


def patched(function: Callable[..., Any], wrapper: Callable[..., Any]) -> Any:
    return wrapt.FunctionWrapper(function, wrapper)


def answer(x: int) -> str:
    return f"answer {x}"


async def answer_later(x: int) -> str:
    return f"answer {x}"


# -- unless_suppressed --------------------------------------------------------------------------


def test_a_wrapper_runs_unless_instrumentation_is_suppressed() -> None:
    calls: list[int] = []

    @unless_suppressed
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append(args[0])
        return "wrapped " + wrapped(*args, **kwargs)

    function = patched(answer, wrapper)
    assert function(1) == "wrapped answer 1"
    with suppress_instrumentation():
        assert function(2) == "answer 2"
    assert calls == [1]
    assert wrapper.__name__ == "wrapper"


def test_an_async_wrapper_steps_aside_for_the_runtime_s_own_coroutine() -> None:
    calls: list[int] = []

    @unless_suppressed
    async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls.append(args[0])
        return "wrapped " + await wrapped(*args, **kwargs)

    function = patched(answer_later, wrapper)
    assert asyncio.run(function(1)) == "wrapped answer 1"
    with suppress_instrumentation():
        assert asyncio.run(function(2)) == "answer 2"
    assert calls == [1]


# -- call_in_hop --------------------------------------------------------------------------------


def test_the_call_runs_inside_the_hop_and_the_hop_ends_with_it(spans: Any) -> None:
    before = trace.get_current_span()
    seen: list[Any] = []

    def call() -> str:
        seen.append(current_chain())
        return "done"

    assert call_in_hop(delegate("planner"), call) == "done"
    assert [hop.agent for hop in seen[0].hops] == ["planner"]
    assert trace.get_current_span() is before  # the hop's context is gone again
    (span,) = spans.all()
    assert span.name == "invoke_agent planner"
    assert span.status.status_code is StatusCode.UNSET


def test_an_error_of_the_call_ends_the_hop_with_it_and_passes_on(spans: Any) -> None:
    before = trace.get_current_span()

    def call() -> str:
        raise KeyError("no such city")

    with pytest.raises(KeyError, match="no such city"):
        call_in_hop(delegate("planner"), call)
    assert trace.get_current_span() is before
    (span,) = spans.all()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "KeyError"


def test_a_hop_refused_on_entry_is_answered_by_refused_and_its_call_never_runs(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    ran: list[bool] = []
    with delegate("planner"):
        answered = call_in_hop(delegate("planner"), lambda: ran.append(True), refused=lambda err: err.reason)
        assert answered == "cycle"
        with pytest.raises(DelegationRefused, match="cycle"):
            call_in_hop(delegate("planner"), lambda: ran.append(True))
    assert ran == []


def test_a_refusal_from_inside_the_call_passes_on_past_refused(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    answered: list[DelegationRefused] = []

    def call() -> None:
        with delegate("planner"):  # planner -> budget -> planner: refused inside budget's call
            pass

    with delegate("planner"), pytest.raises(DelegationRefused, match="cycle"):
        call_in_hop(delegate("budget"), call, refused=answered.append)  # type: ignore[arg-type]
    assert answered == []
    budget = spans.one("invoke_agent budget")
    assert budget.status.status_code is StatusCode.ERROR  # the hop ends with the refusal it let through


def test_enter_starts_the_hop_its_own_way(spans: Any) -> None:
    hop = delegate("planner")
    entered: list[bool] = []

    def enter() -> Any:
        entered.append(True)
        return hop.start()

    assert call_in_hop(hop, current_chain, enter=enter) is not None
    assert entered == [True]
    assert len(spans.all()) == 1


# -- acall_in_hop -------------------------------------------------------------------------------


def test_the_async_form_does_the_same(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")

    async def call() -> str:
        await asyncio.sleep(0)
        return "done"

    async def fail() -> str:
        raise KeyError("no such city")

    async def scenario() -> list[object]:
        results: list[object] = [await acall_in_hop(delegate("planner"), call)]
        with pytest.raises(KeyError):
            await acall_in_hop(delegate("planner"), fail)
        with delegate("planner"):
            results.append(await acall_in_hop(delegate("planner"), call, refused=lambda err: err.reason))
        return results

    before = trace.get_current_span()
    assert asyncio.run(scenario()) == ["done", "cycle"]
    assert trace.get_current_span() is before
    statuses = [s.status.status_code for s in spans.all() if s.name == "invoke_agent planner"]
    assert statuses.count(StatusCode.ERROR) == 2  # the failed call's hop and the refused one
