"""The inline guard's tree budgets, as the processor shows them (issue 11, item 5).

A hop refused for its tree's budget counts in ``otel_guard_span_decisions_total`` with reason
``budget``; the hops a delegation tree used (the largest ``otel_guard.budget.hops`` of its
``otel_guard.chain.root``) are observed once per tree in ``otel_guard_tree_hops`` when the processor
lets go of the tree: its TTL after the tree's latest hop, at capacity, and at stop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.bounds import TREE_HOPS_BUCKETS, DetectorLimits
from otel_guard_processor.engine import EngineDetector
from processor_helpers import ProcessorFactory, export, scrape, series
from processor_spans import Trace, encode, guard_attributes, length_delimited
from processor_spans import value_first as value_first_span

import otel_guard
from otel_guard import DelegationRefused, delegate

ROOTS = ("a1" * 16, "b2" * 16, "c3" * 16)


def ingest(detector: EngineDetector, raw: bytes, now: float = 0.0) -> None:
    detector.ingest(raw, now)


def observed(detector: EngineDetector) -> dict[int | str, int]:
    """The trees observed so far, by bucket upper bound (``inf`` past the last), zeros left out."""
    bounds: list[int | str] = [*TREE_HOPS_BUCKETS, "inf"]
    return {bound: count for bound, count in zip(bounds, detector.tree_hops, strict=True) if count}


def hop(
    trace: Trace,
    name: str,
    parent: Span | None,
    agents: Sequence[str],
    root: str,
    hops: int | None,
    decision: str = "allow",
    reason: str | None = None,
) -> Span:
    """A guard span as the guard writes it: its chain attributes, then the root, then the count."""
    attributes = guard_attributes(agents, root, decision, reason)
    del attributes["otel_guard.chain.root"]
    attributes["otel_guard.chain.root"] = root
    if hops is not None:
        attributes["otel_guard.budget.hops"] = hops
    return trace.agent(name, parent, attributes=attributes)


def real_requests(spans: Any) -> bytes:
    """The finished SDK spans as the OTLP exporter encodes them."""
    raw: bytes = encode_spans(spans.all()).SerializeToString()
    return raw


def run_tree(agents: Sequence[str]) -> DelegationRefused | None:
    """One tree: nested hops into ``agents``; the refusal that ended it, if one did."""
    try:
        with delegate(agents[0]):
            if len(agents) > 1:
                run_tree_below(agents[1:])
    except DelegationRefused as error:
        return error
    return None


def run_tree_below(agents: Sequence[str]) -> None:
    with delegate(agents[0]):
        if len(agents) > 1:
            run_tree_below(agents[1:])


# -- decisions ------------------------------------------------------------------------------------


def test_a_hop_refused_for_its_budget_counts_with_reason_budget(spans: Any) -> None:
    otel_guard.configure(max_hops=3)
    error = run_tree(["planner", "budget", "fx", "ledger"])
    assert error is not None
    assert error.reason == "budget"
    detector = EngineDetector()
    ingest(detector, real_requests(spans))
    assert detector.decisions == {
        ("allow", "", "planner"): 1,
        ("allow", "", "budget"): 1,
        ("allow", "", "fx"): 1,
        ("refuse", "budget", "ledger"): 1,
    }
    detector.release_trees()
    assert observed(detector) == {5: 1}  # the tree made its 3 hops
    assert detector.tree_hops_sum == 3


def test_observe_mode_counts_would_refuse_with_reason_budget(spans: Any) -> None:
    otel_guard.configure(max_hops=2, mode="observe")
    assert run_tree(["planner", "budget", "fx", "ledger"]) is None  # observe: nothing is refused
    detector = EngineDetector()
    ingest(detector, real_requests(spans))
    assert detector.decisions == {
        ("allow", "", "planner"): 1,
        ("allow", "", "budget"): 1,
        ("would_refuse", "budget", "fx"): 1,
        ("would_refuse", "budget", "ledger"): 1,
    }
    detector.release_trees()
    assert observed(detector) == {2: 1}  # the hops past the budget spent nothing
    assert detector.tree_hops_sum == 2


def test_real_trees_each_observe_their_own_hops(spans: Any) -> None:
    otel_guard.configure(max_hops=1000)
    run_tree(["planner"])
    run_tree(["planner", "budget", "fx"])
    for _ in range(2):
        run_tree(["planner", "budget", "fx", "ledger", "audit", "mail"])  # two trees of 6
    detector = EngineDetector()
    ingest(detector, real_requests(spans), now=10.0)
    assert detector.active_trees == 4
    detector.expire(10.0 + detector.limits.trace_ttl - 1)
    assert observed(detector) == {}  # held until the TTL after the tree's latest hop
    detector.expire(10.0 + detector.limits.trace_ttl)
    assert observed(detector) == {1: 1, 5: 1, 10: 2}
    assert detector.tree_hops_sum == 1 + 3 + 6 + 6
    assert detector.tree_evictions == {"ttl": 4, "capacity": 0}
    assert detector.active_trees == 0


# -- trees across traces, requests and orders ----------------------------------------------------


def test_one_tree_across_traces_and_requests_in_any_order_is_observed_once_at_its_largest() -> None:
    first, second, third = Trace(), Trace(), Trace()
    root_a, root_b = ROOTS[0], ROOTS[1]
    planner = hop(first, "planner", None, ["planner"], root_a, 1)
    hop(first, "budget", planner, ["planner", "budget"], root_a, 2)
    # The tree goes on in another trace (a queue), which arrives first, children before parents.
    fx = hop(second, "fx", None, ["planner", "budget", "fx"], root_a, 3)
    hop(second, "ledger", fx, ["planner", "budget", "fx", "ledger"], root_a, 7)
    hop(second, "audit", fx, ["planner", "budget", "fx", "audit"], root_a, 5)
    # Another tree in a third trace, in the same requests.
    other = hop(third, "planner", None, ["planner"], root_b, 1)
    hop(third, "budget", other, ["planner", "budget"], root_b, 2)
    detector = EngineDetector()
    ingest(detector, encode(*reversed(second.spans), third.spans[1]), now=1.0)
    ingest(detector, encode(*first.spans, third.spans[0]), now=2.0)
    ingest(detector, encode(*second.spans), now=3.0)  # sent again: counted once
    assert detector.active_trees == 2
    detector.expire(1000.0)
    assert observed(detector) == {2: 1, 10: 1}
    assert detector.tree_hops_sum == 7 + 2


def test_a_tree_is_held_from_its_latest_hop_and_observed_again_only_after_letting_go() -> None:
    trace = Trace()
    planner = hop(trace, "planner", None, ["planner"], ROOTS[0], 1)
    detector = EngineDetector(DetectorLimits(trace_ttl=10.0))
    ingest(detector, encode(planner), now=0.0)
    later = Trace()
    ingest(detector, encode(hop(later, "budget", None, ["planner", "budget"], ROOTS[0], 2)), now=8.0)
    detector.expire(12.0)  # 12 s after the first hop, 4 s after the latest: still held
    assert observed(detector) == {}
    detector.expire(18.0)
    assert observed(detector) == {2: 1}
    # The tree goes on after it was let go: a new tree, observed again.
    again = Trace()
    ingest(detector, encode(hop(again, "fx", None, ["planner", "budget", "fx"], ROOTS[0], 3)), now=20.0)
    detector.release_trees()
    assert observed(detector) == {2: 1, 5: 1}


def test_spans_without_a_count_hold_no_tree() -> None:
    trace = Trace()
    planner = hop(trace, "planner", None, ["planner"], ROOTS[0], None)  # the budget is off
    hop(trace, "budget", planner, ["planner", "budget"], ROOTS[0], None, "refuse", "budget")
    detector = EngineDetector()
    ingest(detector, encode(*trace.spans))
    assert detector.active_trees == 0
    assert detector.decisions[("refuse", "budget", "budget")] == 1
    detector.release_trees()
    assert observed(detector) == {}


# -- layouts --------------------------------------------------------------------------------------


def value_first(*spans: Span) -> bytes:
    """One request of ``spans`` in the guard's scope, each attribute written value first (as the
    OpenTelemetry Collector writes them)."""
    encoded = b"".join(length_delimited(2, value_first_span(span)) for span in spans)
    return length_delimited(
        1, length_delimited(2, length_delimited(1, length_delimited(1, b"otel_guard")) + encoded)
    )


@pytest.mark.parametrize("order", ["key_first", "value_first"])
def test_counts_read_alike_in_every_layout(order: str) -> None:
    """The guard's layout (root just before the count), and others: a skill and a reason between
    them, counts of several varint bytes, roots of other lengths."""
    trace = Trace()
    planner = hop(trace, "planner", None, ["planner"], ROOTS[0], 1)
    skilled = guard_attributes(["planner", "budget"], ROOTS[0], "would_refuse", "cycle")
    del skilled["otel_guard.chain.root"]
    skilled.update({"otel_guard.chain.root": ROOTS[0], "otel_guard.skill": "plan"})
    skilled["otel_guard.reason"] = skilled.pop("otel_guard.reason")
    skilled["otel_guard.budget.hops"] = 300  # two varint bytes, behind a skill and a reason
    trace.agent("budget", planner, attributes=skilled)
    hop(trace, "fx", planner, ["planner", "fx"], "short-root", 70_000)  # a root of 10 characters
    hop(trace, "audit", planner, ["planner", "audit"], ROOTS[1], 127)
    hop(trace, "mail", planner, ["planner", "mail"], ROOTS[2], 128)
    raw = encode(*trace.spans) if order == "key_first" else value_first(*trace.spans)
    detector = EngineDetector()
    ingest(detector, raw)
    assert detector.cycles == {}
    assert detector.decisions[("would_refuse", "cycle", "budget")] == 1
    assert detector.active_trees == 4
    detector.release_trees()
    assert observed(detector) == {200: 2, 500: 1, "inf": 1}  # 127 and 128; 300; 70,000
    assert detector.tree_hops_sum == 300 + 70_000 + 127 + 128


# -- bounds ---------------------------------------------------------------------------------------


def test_trees_are_bounded_like_traces_and_the_least_recently_active_goes_first() -> None:
    detector = EngineDetector(DetectorLimits(max_traces=2))
    for now, (root, hops) in enumerate(((ROOTS[0], 4), (ROOTS[1], 30), (ROOTS[0], 5), (ROOTS[2], 600))):
        trace = Trace()
        ingest(detector, encode(hop(trace, "planner", None, ["planner"], root, hops)), now=float(now))
    # ROOTS[1] was the least recently active when ROOTS[2] came: observed at its 30 hops.
    assert observed(detector) == {50: 1}
    assert detector.tree_evictions == {"ttl": 0, "capacity": 1}
    assert detector.active_trees == 2
    detector.release_trees()  # stop: what is held is observed, not counted as evicted
    assert observed(detector) == {5: 1, 50: 1, 1000: 1}
    assert detector.tree_evictions == {"ttl": 0, "capacity": 1}
    assert detector.tree_hops_sum == 30 + 5 + 600


# -- the live processor ---------------------------------------------------------------------------


async def test_the_processor_serves_budget_refusals_and_tree_hops(
    start_processor: ProcessorFactory, spans: Any
) -> None:
    otel_guard.configure(max_hops=3)
    run_tree(["planner", "budget", "fx", "ledger"])  # 3 hops, the fourth refused
    run_tree(["planner"])
    otel_guard.configure(max_hops=2, mode="observe")
    run_tree(["planner", "budget", "fx"])  # 2 hops, the third would have been refused
    processor = await start_processor()
    await export(processor, real_requests(spans))
    samples = await scrape(processor)
    decisions = series(samples, "otel_guard_span_decisions_total")
    assert decisions[("ledger", "refuse", "budget")] == 1
    assert decisions[("fx", "would_refuse", "budget")] == 1
    assert series(samples, "otel_guard_tree_hops_count") == {}  # the trees are still held
    assert series(samples, "otel_guard_processor_active_trees") == {(): 3}
    processor.detection.expire(time.monotonic() + processor.config.trace_ttl + 1)
    samples = await scrape(processor)
    assert series(samples, "otel_guard_tree_hops_bucket") == {
        ("1",): 1,
        ("2",): 2,
        ("5",): 3,
        **{(str(bound),): 3 for bound in TREE_HOPS_BUCKETS[3:]},
        ("+Inf",): 3,
    }
    assert series(samples, "otel_guard_tree_hops_count") == {(): 3}
    assert series(samples, "otel_guard_tree_hops_sum") == {(): 1 + 2 + 3}
    assert series(samples, "otel_guard_processor_tree_evictions_total") == {("ttl",): 3}
    assert series(samples, "otel_guard_processor_active_trees") == {}


async def test_the_processor_lets_go_of_its_trees_at_stop(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    trace = Trace()
    await export(processor, encode(hop(trace, "planner", None, ["planner"], ROOTS[0], 12)))
    await processor.detection.settled()
    assert processor.detector.active_trees == 1
    await processor.stop()
    assert processor.detector.active_trees == 0
    assert observed(processor.detector) == {20: 1}


def test_the_guards_spans_between_others_across_resources_count_as_they_do_alone() -> None:
    """A Collector's batch puts two processes' spans in one request, a resource each: the guard's
    spans of each stand between other instrumentations' spans, whose prompts hold ``otel_guard.``
    text, and quote a guard span's decision, root and count byte for byte. Decisions, loops and
    tree hops count as they do when the guard's spans come alone."""

    def loop(root: str) -> list[Span]:
        trace = Trace()
        planner = hop(trace, "planner", None, ["planner"], root, 1)
        budget = hop(trace, "budget", planner, ["planner", "budget"], root, 2)
        hop(trace, "planner", budget, ["planner", "budget", "planner"], root, 3, "refuse", "cycle")
        return trace.spans

    # What a prompt may quote: a guard span's decision and its tree's root and count, as encoded.
    quoted = b"".join(
        KeyValue(key=key, value=value).SerializeToString()
        for key, value in (
            ("otel_guard.decision", AnyValue(string_value="allow")),
            ("otel_guard.chain.root", AnyValue(string_value="d4" * 16)),
            ("otel_guard.budget.hops", AnyValue(int_value=99)),
        )
    ).decode()

    def chatter() -> list[Span]:
        trace = Trace()
        prompt = f"the guard writes {quoted} on its spans " * 20
        run = trace.span("chain run", attributes={"openinference.span.kind": "CHAIN", "input.value": prompt})
        trace.span("llm call", run, attributes={"openinference.span.kind": "LLM", "output.value": prompt})
        return trace.spans

    loops, others = [loop(ROOTS[0]), loop(ROOTS[1])], [chatter() for _ in range(4)]
    batched = ExportTraceServiceRequest()
    for number, guard_spans in enumerate(loops):  # a resource a process: others, the guard's, others
        resource_spans = batched.resource_spans.add()
        for scope, spans in (
            ("oi.x", others[2 * number]),
            ("otel_guard", guard_spans),
            ("oi.x", others[2 * number + 1]),
        ):
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = scope
            scope_spans.spans.extend(spans)
    together, alone = EngineDetector(), EngineDetector()
    ingest(together, batched.SerializeToString())
    for guard_spans in loops:
        ingest(alone, encode(*guard_spans))
    for detector in (together, alone):
        detector.expire(1000.0)
    assert (
        together.decisions
        == alone.decisions
        == {
            ("allow", "", "planner"): 2,
            ("allow", "", "budget"): 2,
            ("refuse", "cycle", "planner"): 2,
        }
    )
    assert together.cycles == alone.cycles == {("cross_function", "planner>budget>planner"): 2}
    assert observed(together) == observed(alone) == {5: 2}
    assert together.tree_hops_sum == alone.tree_hops_sum == 6
