"""Detection state in bytes: what one held span can cost at worst, whatever the senders put in it.

The README bounds the processor's memory by its flags: ``--max-spans`` times the most a held span
can cost, plus the requests held (``--max-pending-bytes``). The most a span can cost is when every
name is new and as long as names are kept (``MAX_NAME_CHARS``) and every path as deep as paths go
(``MAX_PATH_NAMES``): this test builds that traffic and measures what the engine's state grows by
per held span; and what a held span of each bench mix costs (``bench/_processor_traffic.py``),
held to the goal of 150 bytes. The engine's memory is Rust's, out of sight of ``tracemalloc``: the
growth of the resident set is measured, in a process of its own (a clean heap), past a first batch
that pays for what the engine sets up once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from otel_guard_processor.bounds import MAX_NAME_CHARS, MAX_PATH_NAMES, DetectorLimits
from otel_guard_processor.engine import Engine, EngineDetector
from processor_spans import Trace, encode, guard_attributes

WORST_BYTES_PER_SPAN = 1536  # docs/processor.md's figure; measured about 1,200 here (resident)
TYPICAL_BYTES_PER_SPAN = 150  # the goal a held span of every bench mix meets (docs/processor.md)
BENCH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "bench")
FIRST, THEN = 100, 200  # traces of MAX_PATH_NAMES + 16 spans each


def hostile_trace() -> bytes:
    """A chain of MAX_PATH_NAMES + 16 agents, each named anew, every name longer than is kept."""
    trace = Trace()
    parent = None
    for _ in range(MAX_PATH_NAMES + 16):
        parent = trace.agent(os.urandom(MAX_NAME_CHARS).hex(), parent)
    return encode(*trace.spans)


def resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure() -> dict[str, float]:
    """In this process: the resident growth per span held of THEN hostile traces, after FIRST."""
    first = [hostile_trace() for _ in range(FIRST)]
    then = [hostile_trace() for _ in range(THEN)]
    detector = EngineDetector()
    for raw in first:
        detector.ingest(raw, 0.0)
    before, held = resident_bytes(), detector.stored_spans
    for raw in then:
        detector.ingest(raw, 0.0)
    spans = detector.stored_spans - held
    return {
        "per_span": (resident_bytes() - before) / spans,
        "spans": spans,
        "cut": detector.truncated["name"] / detector.stored_spans,
    }


def measure_mix(mix: str) -> dict[str, float]:
    """In this process: the resident growth per span held of 1,000 requests of a bench mix (40
    traces a request, the ``bench/processor_throughput.py`` held-bytes measure), after 200."""
    sys.path.insert(0, BENCH)
    from _processor_traffic import MIXES

    template = MIXES[mix](40)
    first = [template.next()[0] for _ in range(200)]
    then = [template.next()[0] for _ in range(1000)]
    detector = EngineDetector(DetectorLimits(max_traces=10**6, max_spans=10**8, trace_ttl=1e9))
    for raw in first:
        detector.ingest(raw, 0.0)
    before, held = resident_bytes(), detector.stored_spans
    for raw in then:
        detector.ingest(raw, 0.0)
    spans = detector.stored_spans - held
    return {"per_span": (resident_bytes() - before) / spans, "spans": spans}


def chain_trace() -> bytes:
    """One trace of one guard span whose chain holds 64 new names of 62 bytes (all kept: the most
    one span makes the engine hold)."""
    agents = [os.urandom(31).hex() for _ in range(64)]
    trace = Trace()
    trace.agent(agents[-1], attributes=guard_attributes(agents))
    return encode(*trace.spans)


def measure_reckoned(shape: str) -> dict[str, float]:
    """In this process: the engine's reckoning of the bytes it holds beside the resident growth,
    per span, over requests of ``shape`` (a bench mix, or ``chain``), after a first batch."""
    if shape == "chain":
        first = [chain_trace() for _ in range(200)]
        then = [chain_trace() for _ in range(4000)]
    else:
        sys.path.insert(0, BENCH)
        from _processor_traffic import MIXES

        template = MIXES[shape](40)
        first = [template.next()[0] for _ in range(200)]
        then = [template.next()[0] for _ in range(1000)]
    engine = Engine(max_traces=10**6, max_spans=10**8, trace_ttl=1e9, max_held_bytes=2**40)
    for raw in first:
        engine.ingest(raw, 0.0)
    before, reckoned, held = resident_bytes(), engine.held_bytes, engine.stored_spans
    for raw in then:
        engine.ingest(raw, 0.0)
    spans = engine.stored_spans - held
    return {
        "resident": (resident_bytes() - before) / spans,
        "reckoned": (engine.held_bytes - reckoned) / spans,
    }


def in_a_process(call: str) -> dict[str, float]:
    program = f"import json, test_memory_bound as m; print(json.dumps(m.{call}))"
    here = os.path.dirname(__file__)
    path = os.pathsep.join([here, *sys.path])
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    measured: dict[str, float] = json.loads(done.stdout)
    return measured


@pytest.mark.parametrize("mix", ["guarded", "dialects", "budget"])
def test_a_held_span_of_each_bench_mix_costs_at_most_the_goal(mix: str) -> None:
    measured = in_a_process(f"measure_mix({mix!r})")
    assert measured["spans"] >= 500_000
    assert measured["per_span"] <= TYPICAL_BYTES_PER_SPAN, measured


def test_a_held_span_costs_at_most_the_documented_bytes_at_worst() -> None:
    measured = in_a_process("measure()")
    assert measured["spans"] == THEN * (MAX_PATH_NAMES + 16)
    assert measured["cut"] == 1.0  # every name was cut to MAX_NAME_CHARS
    per_span = measured["per_span"]
    assert per_span <= WORST_BYTES_PER_SPAN, per_span
    assert per_span >= WORST_BYTES_PER_SPAN / 3, per_span  # the traffic is as costly as it claims


@pytest.mark.parametrize("shape", ["guarded", "dialects", "chain"])
def test_the_engines_reckoning_of_held_bytes_is_the_resident_growth(shape: str) -> None:
    # --max-held-bytes bounds the reckoning: it is honest only if it is what the heap grows by.
    measured = in_a_process(f"measure_reckoned({shape!r})")
    assert 0.85 <= measured["reckoned"] / measured["resident"] <= 1.2, measured
    if shape == "chain":
        assert measured["reckoned"] <= 24 * 1024, measured  # the most one span holds (docs)
