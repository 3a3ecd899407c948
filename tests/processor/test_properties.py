"""Property tests of the OTLP readers and the detector: arbitrary bytes, arbitrary well-formed requests.

Whatever a sender puts on the wire, reading it either fails with ``MalformedRequest`` (and changes
nothing) or succeeds; detection never raises, never leaves a span unaccounted for, and keeps every
name and label within its bound; and through a running processor, every request it acknowledged
reached the downstream byte for byte, while every other one was refused in a way that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import grpc
import grpc.aio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.bounds import MAX_LABEL_CHARS, MAX_NAME_CHARS, DetectorLimits
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.engine import DecodeError, EngineDetector
from otel_guard_processor.otlp import MalformedRequest, json_to_protobuf
from otel_guard_processor.service import Processor
from processor_helpers import Sink, export

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = [
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.tool.name",
    "gen_ai.workflow.name",
    "gen_ai.caller.agent.name",
    "openinference.span.kind",
    "agent.name",
    "tool.name",
    "graph.node.id",
    "traceloop.span.kind",
    "traceloop.entity.name",
    "otel_guard.decision",
    "otel_guard.reason",
    "otel_guard.name_depth",
    "otel_guard.chain.depth",
    "otel_guard.chain.agents",
    "x",
]
VALUES = [
    "invoke_agent",
    "execute_tool",
    "invoke_workflow",
    "AGENT",
    "TOOL",
    "CHAIN",
    "agent",
    "tool",
    "task",
    "workflow",
    "allow",
    "refuse",
    "planner",
    "budget",
    "",
]
NAMES = st.one_of(
    st.sampled_from(["invoke_agent planner", "invoke_agent budget", "execute_tool planner", "turn", ""]),
    st.sampled_from(["invoke_agent ", "execute_tool ", "invoke_workflow ", "invoke_agent"]).map(
        lambda prefix: prefix + "n" * 300
    ),
    st.text(max_size=40),
)
SCOPES = st.sampled_from(
    [
        "otel_guard",
        "pydantic-ai",
        "openinference.instrumentation.langchain",
        "opentelemetry.instrumentation.langchain",
    ]
)


def any_value(draw: st.DrawFn) -> AnyValue:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return AnyValue(string_value=draw(st.sampled_from(VALUES) | st.text(max_size=20)))
    if kind == 1:
        return AnyValue(int_value=draw(st.integers(-(2**63), 2**63 - 1)))
    if kind == 2:
        return AnyValue(bytes_value=draw(st.binary(max_size=8)))
    if kind == 3:
        value = AnyValue()
        value.array_value.values.extend(
            AnyValue(string_value=v) for v in draw(st.lists(st.sampled_from(VALUES), max_size=4))
        )
        return value
    return AnyValue(bool_value=draw(st.booleans()))


@st.composite
def requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    """Well-formed requests of a few traces whose spans point at each other (or at nothing) freely."""
    trace_ids = [bytes([i + 1]) * 16 for i in range(draw(st.integers(1, 3)))]
    span_ids = [bytes([i + 1]) * 8 for i in range(draw(st.integers(1, 12)))]
    message = ExportTraceServiceRequest()
    resource = message.resource_spans.add()
    for _ in range(draw(st.integers(1, 3))):
        scope = resource.scope_spans.add()
        scope.scope.name = draw(SCOPES)
        for _ in range(draw(st.integers(0, 8))):
            span = Span(
                trace_id=draw(st.sampled_from(trace_ids)),
                span_id=draw(st.sampled_from(span_ids)),
                parent_span_id=draw(st.sampled_from([b"", *span_ids])),
                name=draw(NAMES),
                kind=draw(st.integers(0, 5)),
                start_time_unix_nano=draw(st.integers(0, 10)),
            )
            for _ in range(draw(st.integers(0, 5))):
                span.attributes.append(KeyValue(key=draw(st.sampled_from(KEYS)), value=any_value(draw)))
            if draw(st.booleans()):
                span.links.add(
                    trace_id=draw(st.sampled_from(trace_ids)), span_id=draw(st.sampled_from(span_ids))
                )
            scope.spans.append(span)
    return message


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_detected_or_a_decode_error_that_changes_nothing(raw: bytes) -> None:
    detector = EngineDetector()
    try:
        detector.ingest(raw, 0.0)
    except DecodeError:
        assert (detector.stored_spans, detector.active_traces, detector.duplicates) == (0, 0, 0)
        return
    detector.expire(1_000.0)
    assert detector.stored_spans == 0


@SETTINGS
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_json_bodies_convert_or_are_malformed(body: bytes) -> None:
    with contextlib.suppress(MalformedRequest):  # anything else raised fails the test
        json_to_protobuf(body)


@SETTINGS
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "resourceSpans",
                        "scopeSpans",
                        "spans",
                        "traceId",
                        "spanId",
                        "links",
                        "name",
                        "kind",
                        "attributes",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_arbitrary_json_shapes_convert_or_are_malformed(document: object) -> None:
    with contextlib.suppress(MalformedRequest):  # anything else raised fails the test
        json_to_protobuf(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [document]}]}]}).encode())


@SETTINGS
@given(st.lists(requests(), min_size=1, max_size=4), st.integers(2, 6))
def test_detection_of_any_requests_accounts_for_every_span(
    batches: list[ExportTraceServiceRequest], traces: int
) -> None:
    detector = EngineDetector(DetectorLimits(max_traces=traces, max_spans=40, trace_ttl=5.0))
    received = 0
    for now, message in enumerate(batches):
        raw = message.SerializeToString()
        received += detector.ingest(raw, float(now))
        assert detector.pending_spans <= detector.stored_spans
    detector.expire(1_000.0)
    assert detector.stored_spans == detector.pending_spans == 0
    assert received == sum(len(s.spans) for m in batches for r in m.resource_spans for s in r.scope_spans)
    for caller, callee in detector.delegations:
        assert len(caller) <= MAX_NAME_CHARS
        assert len(callee) <= MAX_NAME_CHARS
    for _, label in detector.cycles:
        assert len(label) <= MAX_LABEL_CHARS
    for decision in detector.decisions:
        assert all(len(part) <= MAX_NAME_CHARS for part in decision)


# What a client may be told instead of OK: the request is malformed, or the processor is full.
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


def sent_as_joins(received: list[bytes], acknowledged: list[bytes]) -> bool:
    """Whether the sends ``received`` are the ``acknowledged`` requests, each once, unchanged: each send
    one request or several joined (the forwarder joins requests that arrive while a send is on its
    way: test_joined_sends.py), in any order. An empty request joined to another leaves no bytes, so
    empty requests left over once every send is accounted for count as joined in."""

    def covers(send: bytes, left: Counter[bytes], took: int) -> Iterator[Counter[bytes]]:
        # Every way ``send`` is a concatenation of at least one request of ``left``: what is left.
        if not send:
            if took:
                yield left
            elif left[b""]:
                yield left - Counter([b""])
            return
        for body in [b for b in left if b and send.startswith(b)]:
            yield from covers(send[len(body) :], left - Counter([body]), took + 1)

    def accounted(sends: list[bytes], left: Counter[bytes]) -> bool:
        if not sends:
            return set(left) <= {b""} and (not left or bool(received))
        return any(accounted(sends[1:], rest) for rest in covers(sends[0], left, 0))

    return accounted(received, Counter(acknowledged))


async def through_a_processor(bodies: list[bytes]) -> None:
    sink = Sink()
    await sink.start()
    config = replace(
        ProcessorConfig(),
        listen="127.0.0.1:0",
        prometheus=None,
        forward=sink.address,
        max_pending_bytes=600,  # small: some requests sent together are refused as busy
        drain_timeout=5.0,
    )
    processor = Processor(config)
    await processor.start()
    try:
        answers = await asyncio.gather(*(export(processor, body) for body in bodies), return_exceptions=True)
        acknowledged = []
        for body, answer in zip(bodies, answers, strict=True):
            if isinstance(answer, grpc.aio.AioRpcError):
                assert answer.code() in REFUSALS, answer
            else:
                assert answer == b"", answer
                acknowledged.append(body)
        assert sent_as_joins(sink.received, acknowledged), (sink.received, acknowledged)
        await processor.detection.settled()
        assert processor.stats.detection_errors == 0
    finally:
        await processor.stop()
        await sink.stop()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(requests().map(lambda message: message.SerializeToString()), st.binary(max_size=120)),
        min_size=1,
        max_size=6,
    )
)
def test_every_acknowledged_request_reaches_the_downstream_unchanged(bodies: list[bytes]) -> None:
    asyncio.run(through_a_processor(bodies))
