"""Lean hop spans (docs/spec.md §9): which hop spans carry the chain's lists.

``otel_guard.chain.agents`` / ``.skills`` are written on a process's first hop of a chain in a trace
(a chain's first hop, an arriving one, one whose previous hop's span is not its parent) and on every
refused or would-refuse hop; a hop made directly under the previous hop's span, in its context,
leaves them out, and every other attribute stays.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from opentelemetry import context, propagate, trace

import otel_guard
from otel_guard import DelegationRefused, delegate
from tests.hop_spans import chain_of

AGENTS = "otel_guard.chain.agents"
SKILLS = "otel_guard.chain.skills"


def lean(span: Any) -> bool:
    attributes = span.attributes or {}
    assert (AGENTS in attributes) == (SKILLS in attributes), attributes
    return AGENTS not in attributes


def lists(span: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    attributes = span.attributes or {}
    return tuple(attributes[AGENTS]), tuple(attributes[SKILLS])


def test_a_nested_hop_leaves_the_lists_out_and_keeps_every_other_attribute(spans: Any) -> None:
    with delegate("planner", "plan") as planner, delegate("budget", "price") as budget:
        with delegate("fx", kind="tool"):
            pass
        # The same hop from the same chain, its span under a span of another tracer: not nested.
        with trace.get_tracer("test").start_as_current_span("step"), delegate("fx", kind="tool"):
            pass
    first = spans.one("invoke_agent planner")
    assert not lean(first)
    assert lists(first) == (("planner",), ("plan",))
    assert lean(spans.one("invoke_agent budget"))
    nested, under_step = spans.named("execute_tool fx")
    assert lean(nested)
    assert not lean(under_step)
    assert lists(under_step) == (("planner", "budget", "fx"), ("plan", "price", ""))
    # Every other attribute is the same (the tree's count aside: one more hop).
    kept = {k: v for k, v in (under_step.attributes or {}).items() if k not in (AGENTS, SKILLS)}
    assert {**kept, "otel_guard.budget.hops": 0} == {**(nested.attributes or {}), "otel_guard.budget.hops": 0}
    assert chain_of(nested, spans) == lists(under_step)  # its path is its ancestors'
    assert nested.parent is not None
    assert nested.parent.span_id == budget.span.get_span_context().span_id
    assert planner.chain is not None
    assert nested.attributes["otel_guard.chain.root"] == planner.chain.root


def test_every_chains_first_hop_has_the_lists(spans: Any) -> None:
    for _ in range(3):  # the later ones reuse the first one's shared plan
        with delegate("planner", "plan"):
            pass
    assert [lists(s) for s in spans.named("invoke_agent planner")] == [(("planner",), ("plan",))] * 3


def test_an_arriving_hop_has_the_lists(spans: Any) -> None:
    carrier: dict[str, str] = {}
    with delegate("planner"), delegate("budget") as budget:
        propagate.inject(carrier)
        # The server side in this process, directly under the caller's span: still an arriving hop.
        with delegate("budget", receiving=True):
            pass
    token = context.attach(propagate.extract(carrier, context.Context()))
    try:
        with delegate("budget", receiving=True) as received, delegate("fx") as fx:
            pass
    finally:
        context.detach(token)
    assert received.chain == budget.chain
    assert fx.chain is not None
    assert fx.chain.agents == ("planner", "budget", "fx")
    budgets = sorted(spans.named("invoke_agent budget"), key=lambda s: s.start_time)
    arrived = [s for s in budgets if s.attributes["otel_guard.chain.depth"] == 2]
    assert [lean(s) for s in arrived] == [True, False, False]
    assert all(lists(s)[0] == ("planner", "budget") for s in arrived[1:])
    over_the_wire = arrived[2]
    assert over_the_wire.parent is not None
    assert over_the_wire.parent.is_remote
    assert lean(spans.one("invoke_agent fx"))  # nested in the arriving hop


def test_refused_and_would_refuse_hops_have_the_lists(spans: Any) -> None:
    otel_guard.configure(mode="observe")
    with delegate("planner", "plan"), delegate("budget", "price"), delegate("planner", "plan") as again:
        assert again.decision == "would_refuse"
    otel_guard.configure(mode="enforce")
    with (
        delegate("planner", "plan"),
        delegate("budget", "price"),
        pytest.raises(DelegationRefused),
        delegate("planner", "plan"),
    ):
        pass
    would, refused = (
        s for s in spans.named("invoke_agent planner") if s.attributes["otel_guard.chain.depth"] == 3
    )
    assert would.attributes["otel_guard.decision"] == "would_refuse"
    assert refused.attributes["otel_guard.decision"] == "refuse"
    for span in (would, refused):
        assert lists(span) == (("planner", "budget", "planner"), ("plan", "price", "plan"))
    assert all(lean(s) for s in spans.named("invoke_agent budget"))


def test_a_hop_past_a_budget_in_observe_mode_has_the_lists(spans: Any) -> None:
    otel_guard.configure(mode="observe", max_hops=2)
    with delegate("planner"), delegate("budget"), delegate("fx") as fx:
        assert fx.decision == "would_refuse"
    span = spans.one("invoke_agent fx")
    assert span.attributes["otel_guard.budget.exhausted"] == "hops"
    assert lists(span)[0] == ("planner", "budget", "fx")
    assert lean(spans.one("invoke_agent budget"))


def test_a_hop_in_a_thread_or_task_that_kept_the_hops_context_is_nested(spans: Any) -> None:
    def tool() -> None:
        with delegate("lookup", kind="tool"):
            pass

    async def in_tasks() -> None:
        with delegate("async_planner"):
            await asyncio.gather(asyncio.create_task(asyncio.to_thread(tool)), asyncio.create_task(atool()))

    async def atool() -> None:
        async with delegate("lookup", kind="tool"):
            pass

    with delegate("planner") as planner:
        thread = threading.Thread(target=tool)
        thread.start()
        thread.join(10)
        with ThreadPoolExecutor(1) as pool:
            pool.submit(tool).result(10)
    asyncio.run(in_tasks())
    lookups = spans.named("execute_tool lookup")
    assert len(lookups) == 4
    assert all(lean(s) for s in lookups)
    assert [chain_of(s, spans)[0][0] for s in lookups].count("planner") == 2
    assert planner.span.get_span_context().span_id in {s.parent.span_id for s in lookups if s.parent}


def test_a_hop_whose_context_lost_the_previous_hops_span_has_the_lists(spans: Any) -> None:
    """A task started with the chain but not the hop's span (a context rebuilt from the baggage, a
    new trace under the same chain) makes a span that is not under the previous hop's: it names its
    chain itself."""
    tracer = trace.get_tracer("test")

    async def detached(kept: context.Context) -> None:
        # The task's context keeps the chain (baggage) but not the hop's span.
        context.attach(trace.set_span_in_context(trace.INVALID_SPAN, kept))
        with delegate("lookup", kind="tool"):
            pass

    async def new_trace() -> None:
        with tracer.start_as_current_span("job", context=context.Context()), delegate("fx"):
            pass

    async def main() -> None:
        with delegate("planner"):
            await asyncio.create_task(detached(context.get_current()))
            await asyncio.create_task(new_trace())

    asyncio.run(main())
    lookup, fx = spans.one("execute_tool lookup"), spans.one("invoke_agent fx")
    assert lists(lookup)[0] == ("planner", "lookup")
    assert lookup.parent is None  # a trace of its own
    assert lists(fx)[0] == ("planner", "fx")
    job = spans.one("job")
    assert fx.parent is not None
    assert fx.parent.span_id == job.context.span_id
    assert fx.context.trace_id != spans.one("invoke_agent planner").context.trace_id


def test_a_decided_hop_is_nested_only_where_its_span_goes_under_the_previous_hops(spans: Any) -> None:
    tracer = trace.get_tracer("test")
    with delegate("planner"):
        under_planner = delegate("lookup", kind="tool")
        token = context.attach(under_planner.decide())
        under_planner.open()
        under_planner.finish()
        context.detach(token)
        with tracer.start_as_current_span("tool run") as run:
            elsewhere = delegate("lookup", kind="tool")
            token = context.attach(elsewhere.decide())
            elsewhere.open(trace.set_span_in_context(run))
            elsewhere.finish()
            context.detach(token)
    first, second = spans.named("execute_tool lookup")
    assert lean(first)
    assert lists(second)[0] == ("planner", "lookup")
