"""Scale-out behind the real Collector's loadbalancing exporter: routing by the chain root, and an
instance killed mid-stream.

Routing by the chain root (``scaleout-by-chain.yaml``): delegation trees made by the inline guard
itself (``otel_guard.delegate``), each going on in two new traces as through a queue that keeps the
baggage but not the trace, with model-call spans of another instrumentation between. The same
requests go straight to one processor, and through the Collector to three: routed by the chain
root, the fleet's summed counters -- loops, decisions, delegations and the trees' hop counts --
are the one processor's, and the spans without a chain root stop at the tier's filter. Routed by
trace id (``scaleout.yaml``), loops still count the same (the chain rides on every hop), but a tree
whose traces went to several instances is observed once on each of them.

An instance killed mid-stream (``scaleout.yaml`` as shipped: trace id routing, static resolver,
sending queue and retry): three processor processes, each forwarding to its own store; a steady
stream of loop traces, each sent in two requests 2.5 s apart; one processor SIGKILLed, started
again on the same port a few seconds later. Every span the Collector accepted reaches a store, every
trace in one store (the static ring does not change while an endpoint is down), and the figures --
duplicates, how long the restarted instance waited for its backlog, what became of the loops of the
traces split across the restart -- are printed and recorded (``record_property``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fleet import (
    Instance,
    TimedSink,
    collector_in_front,
    cycles_of,
    request_spans,
    stream_loop_traces,
    waiting,
)
from opentelemetry import baggage, context
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.service import Processor
from processor_helpers import export
from test_collector_pipelines import Pipeline, received_span_ids

import otel_guard
from otel_guard import DelegationRefused, delegate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TREES = 24
WAIT = 30.0

# --- routing by the chain root -------------------------------------------------------------------


def guarded_tree(spans: Any) -> bytes:
    """One delegation tree over three traces, recorded by the inline guard; one export request.

    planner → budget (trace 1); the tree goes on in new traces with the chain in the baggage only:
    budget → writer (trace 2) and budget → planner, refused as a loop (trace 3). A model call of
    another instrumentation runs under budget and writer: spans without a chain root.
    """
    spans.clear()
    model = trace_api.get_tracer("tests.model-calls")
    with delegate("planner"), delegate("budget"):
        with model.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}):
            pass
        chain = baggage.get_all()
    fresh = context.Context()
    for key, value in chain.items():
        fresh = baggage.set_baggage(key, value, fresh)
    token = context.attach(fresh)
    try:
        with (
            delegate("writer"),
            model.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat"}),
        ):
            pass
        with pytest.raises(DelegationRefused), delegate("planner"):
            pass
    finally:
        context.detach(token)
    recorded = spans.all()
    assert len({span.context.trace_id for span in recorded}) == 3
    return bytes(encode_spans(recorded).SerializeToString())


def has_chain_root(span: Any) -> bool:
    return any(kv.key == "otel_guard.chain.root" for kv in span.attributes)


def is_refused(span: Any) -> bool:
    return any(
        kv.key == "otel_guard.decision" and kv.value.string_value == "refuse" for kv in span.attributes
    )


def counts(processors: list[Processor]) -> dict[str, Counter[Any]]:
    """The processors' counters summed: loops, decisions, delegations, and trees by hop bucket."""
    summed: dict[str, Counter[Any]] = {
        name: Counter() for name in ("cycles", "decisions", "delegations", "trees")
    }
    for processor in processors:
        detector = processor.detector
        summed["cycles"].update(detector.cycles)
        summed["decisions"].update(detector.decisions)
        summed["delegations"].update(detector.delegations)
        summed["trees"].update(dict(enumerate(detector.tree_hops)))
        summed["trees"]["hops_sum"] += detector.tree_hops_sum
    return {name: +counter for name, counter in summed.items()}


async def let_go(processors: list[Processor]) -> None:
    """Every request's detection done, and every tree held observed (as at the processor's stop)."""
    for processor in processors:
        await processor.detection.settled()
        await processor.detection.run(partial(processor.detector.count_waiting, time.monotonic()))
        await processor.detection.run(processor.detector.release_trees)


async def one_processor_counts(requests: list[bytes]) -> dict[str, Counter[Any]]:
    processor = Processor(replace(ProcessorConfig(), listen="127.0.0.1:0", prometheus=None, forward=None))
    await processor.start()
    try:
        for raw in requests:
            await export(processor, raw)
        await let_go([processor])
        return counts([processor])
    finally:
        await processor.stop()


@pytest.mark.parametrize("config", ["scaleout-by-chain", "scaleout"])
async def test_routed_by_chain_root_the_fleet_counts_each_tree_as_one_instance_does(
    tmp_path: Path, spans: Any, config: str, record_property: Callable[[str, object], None]
) -> None:
    otel_guard.configure(mode="enforce", cycle_rule="agent")
    requests = [guarded_tree(spans) for _ in range(TREES)]
    sent = [span for raw in requests for span in request_spans(raw)]
    guard_spans = Counter(span.span_id for span in sent if has_chain_root(span))
    assert len(guard_spans) == 4 * TREES
    assert len(sent) == 6 * TREES

    one = await one_processor_counts(requests)
    assert one["cycles"] == {("cross_trace", "planner>budget>planner"): TREES}
    assert sum(count for bucket, count in one["trees"].items() if bucket != "hops_sum") == TREES

    async with Pipeline(tmp_path, config) as pipeline:
        for raw in requests:
            await pipeline.send(raw)
        expected = guard_spans if config == "scaleout-by-chain" else Counter(span.span_id for span in sent)
        assert await pipeline.stored(expected) == expected  # exactly once; by chain, only the guard's
        await let_go(pipeline.processors)
        fleet = counts(pipeline.processors)
        trees_per_instance = [sum(p.detector.tree_hops) for p in pipeline.processors]
    observed = sum(count for bucket, count in fleet["trees"].items() if bucket != "hops_sum")
    print(f"{config}: {TREES} trees of 3 traces; trees observed by the fleet {observed} {trees_per_instance}")
    record_property("trees_observed", observed)
    assert len([n for n in trees_per_instance if n]) >= 2  # spread over the instances
    for name in ("cycles", "decisions", "delegations"):
        assert fleet[name] == one[name], name
    if config == "scaleout-by-chain":
        assert fleet["trees"] == one["trees"]  # each tree observed once, with all its hops
    else:
        assert observed > TREES  # a tree whose traces went to several instances counts on each


# --- an instance killed mid-stream ---------------------------------------------------------------

TICK = 0.04  # a trace every 40 ms, its two requests LAG ticks (2.5 s: longer than a batch) apart
LAG = 62
STREAM = 9.0  # seconds of traces
KILL_AFTER = 4.0  # the victim is killed at its first request this far into the stream
DOWN = 3.0  # and started again this long after
ACK_DELAY = 0.3  # the victim's store acknowledges a request this long after it stored it


async def test_an_instance_killed_mid_stream_loses_no_accepted_span(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    sinks = [TimedSink(), TimedSink(ACK_DELAY), TimedSink()]
    for sink in sinks:
        await sink.start()
    instances = [Instance(tmp_path, n, sink.address) for n, sink in enumerate(sinks)]
    victim, victim_sink = instances[1], sinks[1]
    moments: dict[str, float] = {}
    before_kill: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    in_flight: set[bytes] = set()  # the spans of the request the victim died holding

    async def kill_and_restart(start: float) -> None:
        """SIGKILL the victim while it waits for its store's answer to a request, then start it again."""
        await asyncio.sleep(start + KILL_AFTER - time.monotonic())
        victim_sink.stored.clear()
        await victim_sink.stored.wait()  # a request is in flight: stored, not yet acknowledged
        held = request_spans(victim_sink.received[-1])
        in_flight.update(span.span_id for span in held)
        moments["refused_in_flight"] = sum(is_refused(span) for span in held)
        before_kill.update(await victim.scrape())  # what a scrape just before the kill got
        victim.kill()
        moments["killed"] = time.monotonic()
        await asyncio.sleep(DOWN)
        victim.start()
        moments["started"] = time.monotonic()
        moments["ready"] = await victim.ready()

    try:
        async with collector_in_front(tmp_path, instances) as port:
            sent = await stream_loop_traces(port, tick=TICK, lag=LAG, seconds=STREAM, chaos=kill_and_restart)
            accepted, traces = sent.accepted, sent.traces

            # Every accepted span stored, and the request in flight at the kill sent again: the
            # Collector retries what was not acknowledged (its backoff: 5 s, then 1.5 times longer).
            def delivered() -> bool:
                stored = sum((received_span_ids(s) for s in sinks), Counter[bytes]())
                return set(accepted) <= set(stored) and all(stored[span] > 1 for span in in_flight)

            deadline = moments["killed"] + 2 * WAIT / 3
            while not delivered():
                assert time.monotonic() < deadline, "spans the Collector accepted never reached a store"
                await asyncio.sleep(0.1)
            moments["delivered"] = time.monotonic()
            await asyncio.sleep(0.5)  # what would come twice has come
            # Spans waiting for a parent the killed process held settle after the trace TTL.
            deadline = time.monotonic() + Instance.trace_ttl + 8
            while True:
                final = [await instance.scrape() for instance in instances]
                if not any(waiting(samples) for samples in final) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.25)
    finally:
        for sink in sinks:
            await sink.stop()

    stored: Counter[bytes] = Counter()
    for sink in sinks:
        stored.update(received_span_ids(sink))
    lost = len(set(accepted) - set(stored))
    duplicated = sum(stored.values()) - len(stored)
    assert sent.refused == 0  # the Collector took every request (into its queue)
    assert lost == 0  # and stored every span it took
    assert set(stored) == set(accepted)
    # At least once: the request the victim died holding (stored downstream, never acknowledged)
    # was sent again, to the restarted instance.
    assert in_flight
    assert {span for span, n in stored.items() if n > 1} >= in_flight
    # Each trace in one store: the static ring kept the dead endpoint, and its traces waited for it.
    where: dict[bytes, set[int]] = {}
    for n, sink in enumerate(sinks):
        for _, trace_id, _ in sink.arrivals():
            where.setdefault(trace_id, set()).add(n)
    assert len(where) == traces
    assert all(len(stores) == 1 for stores in where.values())
    # The victim's traces. Split: a span acknowledged by the killed process, another first stored
    # after the restart -- the restarted instance never had the first part.
    killed, started = moments["killed"], moments["started"]
    first_stored: dict[bytes, tuple[float, bytes]] = {}
    for when, trace_id, span_id in victim_sink.arrivals():
        first_stored.setdefault(span_id, (when, trace_id))
    acked_before = {
        span for span, (when, _) in first_stored.items() if when < killed and span not in in_flight
    }
    reached_new = {trace_id for when, trace_id, _ in victim_sink.arrivals() if when > started}
    split = {first_stored[span][1] for span in acked_before} & reached_new
    after = [when for when, _, _ in victim_sink.arrivals() if when > started]
    twice = int(moments["refused_in_flight"])
    loops_after_restart = cycles_of(final[1])
    fleet = cycles_of(before_kill) + loops_after_restart + cycles_of(final[0]) + cycles_of(final[2])
    figures = {
        "traces": traces,
        "spans_accepted": len(accepted),
        "spans_lost": lost,
        "spans_duplicated": duplicated,
        "spans_in_flight_at_kill": len(in_flight),
        "down_s": round(started - killed, 2),
        "restart_to_ready_s": round(moments["ready"] - started, 2),
        "restart_to_first_delivery_s": round(min(after) - started, 2),
        "restart_to_all_delivered_s": round(max(after) - started, 2),
        "victim_traces": len({trace_id for _, trace_id in first_stored.values()}),
        "victim_traces_split": len(split),
        "loops_in_flight_at_kill": twice,
        "victim_loops_before_kill": dict(cycles_of(before_kill)),
        "victim_loops_after_restart": dict(loops_after_restart),
        "fleet_loops": dict(fleet),
    }
    print("killed mid-stream:", figures)
    for name, value in figures.items():
        record_property(name, value)
    assert not any(waiting(samples) for samples in final)
    # A split trace's loop is still counted, once, by the restarted instance: the repeat's parent
    # died with the killed process, so it waits for it until the TTL, then settles on the chain it
    # carries -- a cross-trace loop now, where the whole trace showed a cross-function one.
    assert loops_after_restart["cross_trace"] >= len(split)
    # Every loop counted (the victim scraped just before the kill), the in-flight request's
    # twice: by the killed process, which had detected them, and by the restarted one.
    assert sum(fleet.values()) == traces + twice
