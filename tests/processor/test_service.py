"""The running service: the TTL sweep settles orphans, and a detection failure never costs spans."""

from __future__ import annotations

import asyncio

import pytest
from otel_guard_processor.engine import EngineDetector
from processor_helpers import ProcessorFactory, Sink, export, scrape, series
from processor_spans import Trace, encode


async def test_spans_whose_parent_never_comes_are_settled_by_the_ttl_sweep(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor(trace_ttl=0.5)
    trace = Trace()
    never_sent = trace.agent("planner")
    budget = trace.agent("budget", never_sent)
    trace.agent("budget", budget)
    await export(processor, encode(*trace.spans[1:]))
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.pending_spans == 2
    for _ in range(50):  # the sweep runs every second; bounded wait
        if processor.detector.active_traces == 0:
            break
        await asyncio.sleep(0.1)
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.cycles == {("direct", "budget>budget"): 1}
    samples = await scrape(processor)
    assert series(samples, "otel_guard_processor_trace_evictions_total") == {("ttl",): 1}
    assert series(samples, "otel_guard_processor_waiting_spans") == {}


async def test_a_failure_in_detection_still_forwards_and_is_counted(
    start_processor: ProcessorFactory, sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    processor = await start_processor(forward=sink.address)

    def broken(self: EngineDetector, raw: bytes, now: float) -> int:
        self.engine._fault("a bug in the engine")  # a real panic inside the engine
        raise AssertionError("the panic was not an EngineFault")

    monkeypatch.setattr(EngineDetector, "ingest", broken)
    trace = Trace()
    trace.agent("planner")
    raw = encode(*trace.spans)
    assert await export(processor, raw) == b""
    assert sink.received == [raw]
    samples = await scrape(processor)
    assert series(samples, "otel_guard_processor_detection_errors_total") == {(): 1}
    assert series(samples, "otel_guard_processor_spans_total") == {("received",): 1, ("forwarded",): 1}
    assert processor.detector.engine.faults == 1
