"""The engine's decoder through the binding, against upb (the protobuf classes) on the same bytes.

On any request upb reads, the engine reads the same spans, in any field order; on bytes that are
not a request it raises DecodeError (a ValueError) or, where upb refuses only for something inside
a field the engine never reads, answers; it never crashes the interpreter.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_guard_processor import engine
from otlp_wire import KEYS, reorder, requests, upb_summary, varint
from processor_spans import Trace, encode, guard_attributes, request, value_first

SETTINGS = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def upb_reads(raw: bytes) -> bool:
    try:
        ExportTraceServiceRequest.FromString(raw)
    except Exception:
        return False
    return True


@SETTINGS
@given(requests(), st.randoms(use_true_random=False))
def test_any_request_reads_as_upb_reads_it_in_any_field_order(
    message: ExportTraceServiceRequest, rng: random.Random
) -> None:
    raw = message.SerializeToString()
    assert engine.decode_summary(raw, KEYS) == upb_summary(raw, KEYS)
    reordered = reorder(raw, rng)
    assert engine.decode_summary(reordered, KEYS) == upb_summary(reordered, KEYS) == upb_summary(raw, KEYS)
    spans, links, attributes = engine.decode_counts(reordered, KEYS)
    _, summary = upb_summary(raw, KEYS)
    assert (spans, links, attributes) == (
        len(summary),
        sum(len(span[7]) for span in summary),  # type: ignore[index]
        sum(len(span[8]) for span in summary),  # type: ignore[index]
    )


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(reorder(draw(requests()).SerializeToString(), draw(st.randoms(use_true_random=False))))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "insert", "remove", "cut"]))
        at = draw(st.integers(0, len(data)))
        if kind == "flip" and data:
            data[at % len(data)] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = bytes([draw(st.integers(0, 255))])
        elif kind == "remove" and data:
            del data[at % len(data)]
        elif kind == "cut":
            del data[at:]
    return bytes(data)


@SETTINGS
@given(st.one_of(mutated(), st.binary(max_size=300)))
def test_bytes_that_are_not_a_request_are_a_decode_error_never_a_crash(raw: bytes) -> None:
    if upb_reads(raw):
        assert engine.decode_summary(raw, KEYS) == upb_summary(raw, KEYS)
        return
    try:
        engine.decode_summary(raw, KEYS)  # upb refused it: an answer or a DecodeError, nothing else
    except engine.DecodeError as exc:
        message = str(exc)
    else:
        return
    assert message.startswith("not an OTLP ExportTraceServiceRequest: at byte ")


def test_the_guards_spans_and_value_first_attributes_read_alike() -> None:
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    budget = trace.agent("budget", planner, attributes=guard_attributes(["planner", "budget"]))
    keys = ["gen_ai.agent.name", "otel_guard.chain.agents", "otel_guard.chain.depth", "otel_guard.decision"]
    raw = encode(planner, budget)
    scopes, spans = engine.decode_summary(raw, keys)
    assert scopes == [(0, "otel_guard", "")]
    assert spans[1][3] == "invoke_agent budget"
    assert spans[1][8] == [
        ("gen_ai.agent.name", "budget"),
        ("otel_guard.chain.agents", ["planner", "budget"]),
        ("otel_guard.chain.depth", 2),
        ("otel_guard.decision", "allow"),
    ]
    # The Collector's encoding: each KeyValue value first.
    scope = request(planner, budget).resource_spans[0].scope_spans[0].scope.SerializeToString()
    scope_spans = _field(1, scope) + _field(2, value_first(planner)) + _field(2, value_first(budget))
    collector = _field(1, _field(2, scope_spans))
    assert engine.decode_summary(collector, keys) == (scopes, spans)


def _field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_a_decode_error_says_where_and_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"at byte 2, in ExportTraceServiceRequest: a length past the end"):
        engine.decode_counts(b"\x0a\x05", [])
    assert issubclass(engine.DecodeError, ValueError)
    assert engine.DecodeError.__module__ == "otel_guard_processor._engine"


def test_arguments_of_the_wrong_type_are_type_errors() -> None:
    with pytest.raises(TypeError):
        engine.decode_counts("not bytes", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        engine.decode_counts(b"", "gen_ai.agent.name")


def test_a_panic_in_the_engine_is_an_engine_fault_and_the_interpreter_goes_on() -> None:
    # In a child process, so that the panic's message on stderr and any crash stay out of the run.
    program = (
        "from otel_guard_processor import _engine\n"
        "try:\n"
        "    _engine._fault('a bug')\n"
        "except RuntimeError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        "print(_engine.decode_counts(b'', []))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["EngineFault a bug", "(0, 0, 0)"]
