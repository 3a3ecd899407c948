"""The engine through its binding: ``Engine`` and its ``Events``, and ``EngineDetector``, the tallies
the service's metrics read (with the bounds of state they count).

Bad input is an error value (DecodeError, a ValueError) that changes nothing; a panic is an
EngineFault after which the engine starts again empty, never a crash; random and damaged bytes are
never a panic.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otel_guard_processor import engine
from otel_guard_processor.bounds import TREE_HOPS_BUCKETS, DetectorLimits
from otel_guard_processor.engine import DecodeError, Engine, EngineDetector
from processor_spans import Trace, encode, guard_attributes
from test_engine_decode import mutated

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SWEEP = 1e12


def a_loop(trace: Trace | None = None) -> Trace:
    trace = trace or Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", planner)
    trace.agent("planner", budget)
    return trace


def test_events_say_what_a_call_counted() -> None:
    trace = a_loop()
    engine_ = Engine(cycle_wait=0.0)
    events = engine_.ingest(encode(*trace.spans), 5.0)
    assert events.received == 3
    ((kind, label, trace_id, span_id),) = events.cycles
    assert (kind, label) == ("cross_function", "planner>budget>planner")
    assert (trace_id, span_id) == (trace.spans[2].trace_id, trace.spans[2].span_id)
    assert events.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}
    assert (events.decisions, events.tree_hops, events.dropped, events.duplicates) == ({}, [], 0, 0)
    assert events.evictions == events.tree_evictions == {"ttl": 0, "capacity": 0}
    assert events.truncated == {"name": 0, "label": 0}
    assert (engine_.active_traces, engine_.stored_spans, engine_.pending_spans) == (1, 3, 0)
    assert engine_.ingest(encode(*trace.spans), 6.0).duplicates == 3
    assert engine_.expire(6.0 + 120.0).evictions == {"ttl": 1, "capacity": 0}
    assert (engine_.active_traces, engine_.stored_spans) == (0, 0)


def test_bytes_that_are_not_a_request_are_a_decode_error_and_change_nothing() -> None:
    engine_ = Engine()
    engine_.ingest(encode(*a_loop().spans[:2]), 0.0)
    with pytest.raises(DecodeError, match=r"^not an OTLP ExportTraceServiceRequest: at byte 2"):
        engine_.ingest(b"\x0a\x05", 0.0)
    assert issubclass(DecodeError, ValueError)
    assert (engine_.stored_spans, engine_.faults) == (2, 0)


def test_limits_it_cannot_run_with_are_value_errors() -> None:
    with pytest.raises(ValueError, match="max_traces must be at least 2"):
        Engine(max_traces=1)
    with pytest.raises(ValueError, match="finite and not negative"):
        Engine(trace_ttl=float("nan"))
    with pytest.raises(TypeError):
        Engine(5)  # type: ignore[call-arg]


def test_a_panic_is_an_engine_fault_and_the_engine_starts_again_empty() -> None:
    # In a child process, so that the panic's message on stderr stays out of the run.
    program = (
        "from otel_guard_processor.engine import Engine, EngineFault\n"
        "from processor_spans import Trace, encode\n"
        "engine = Engine()\n"
        "trace = Trace(); trace.agent('planner')\n"
        "engine.ingest(encode(*trace.spans), 0.0)\n"
        "try:\n"
        "    engine._fault('a bug')\n"
        "except EngineFault as exc:\n"
        "    print(type(exc).__mro__[1].__name__, exc)\n"
        "print(engine.faults, engine.stored_spans, engine.ingest(encode(*trace.spans), 0.0).received)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["RuntimeError a bug", "1 0 1"]


@SETTINGS
@given(st.one_of(mutated(), st.binary(max_size=400)))
def test_random_and_damaged_bytes_are_events_or_a_decode_error_never_a_fault(raw: bytes) -> None:
    engine_ = Engine()
    engine_.ingest(encode(*a_loop().spans), 0.0)
    with contextlib.suppress(DecodeError):
        engine_.ingest(raw, 1.0)
    engine_.expire(SWEEP)
    assert (engine_.faults, engine_.stored_spans, engine_.pending_spans) == (0, 0, 0)


def held(detector: EngineDetector) -> tuple[int, int, int, int]:
    return (detector.active_traces, detector.active_trees, detector.stored_spans, detector.pending_spans)


def test_the_bounds_count_what_they_let_go_of() -> None:
    """Traces past max_traces, spans of a full trace, spans sent twice, TTLs, trees past capacity
    and their hops (the tallies the retired pure-Python detector made of the same traffic)."""
    limits = DetectorLimits(max_traces=3, max_spans_per_trace=2, trace_ttl=10.0)
    raws = []
    for at in range(5):
        trace = Trace()
        hops = {**guard_attributes(["planner"], root=f"r{at}"), "otel_guard.budget.hops": at + 1}
        planner = trace.agent("planner", attributes=hops)
        trace.agent("budget", planner)
        raws.append((encode(*trace.spans), float(at)))
        raws.append((encode(*trace.spans), float(at)))  # again: duplicates
        raws.append((encode(trace.agent("fx", planner)), float(at)))  # the trace is full
    compiled = EngineDetector(limits)
    for raw, now in raws:
        compiled.ingest(raw, now)
    assert held(compiled) == (3, 3, 6, 0)
    assert compiled.duplicates == 10
    compiled.expire(12.0)
    assert held(compiled) == (2, 2, 4, 0)
    compiled.expire(30.0)
    assert held(compiled) == (0, 0, 0, 0)
    assert compiled.evictions == {"ttl": 3, "capacity": 2}
    assert compiled.dropped == {"trace_full": 5}
    assert compiled.tree_evictions == {"ttl": 3, "capacity": 2}
    assert compiled.tree_hops_sum == sum(range(1, 6))
    assert sum(compiled.tree_hops) == 5
    assert len(compiled.tree_hops) == len(TREE_HOPS_BUCKETS) + 1
    assert compiled.release_trees() == 0


def test_label_sets_past_their_bound_fold_into_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "MAX_SERIES", 2)
    detector = EngineDetector()
    trace = Trace()
    planner = trace.agent("planner")
    for name in ("a", "b", "c", "d"):
        trace.agent(name, planner)
    detector.ingest(encode(*trace.spans), 0.0)
    assert detector.delegations == {("planner", "a"): 1, ("planner", "b"): 1, ("_overflow", "_overflow"): 2}


def test_each_counted_cycle_keeps_the_span_where_its_name_returned() -> None:
    detector = EngineDetector(DetectorLimits(count_wait=0.0), clock=lambda: 5.0)
    trace = a_loop()
    detector.ingest(encode(*trace.spans), 0.0)
    returned = trace.spans[2]
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.cycle_spans == {
        ("cross_function", "planner>budget>planner"): (returned.trace_id, returned.span_id, 5.0)
    }
