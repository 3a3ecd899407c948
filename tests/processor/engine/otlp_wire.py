"""OTLP trace requests for the engine's tests: generated with hypothesis through the protobuf classes,
read back through upb (what the engine must agree with), and re-encoded in other field orders.

An encoder may write a message's fields in any order (the Collector writes a KeyValue's value before
its key); :func:`reorder` writes them so at every depth, keeping the order of each field's repeats,
which keeps the message's meaning.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

KEYS = ("gen_ai.agent.name", "gen_ai.operation.name", "otel_guard.chain.agents", "k", "")

# --- generating requests -------------------------------------------------------------------------

texts = st.one_of(st.text(alphabet="abcdefgh_. ", max_size=12), st.text(max_size=8))
keys = st.one_of(st.sampled_from([*KEYS, "prompt", "gen_ai.agent.nam", "gen_ai.agent.namf"]), texts)


def _leaf() -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        texts.map(lambda text: AnyValue(string_value=text)),
        st.booleans().map(lambda flag: AnyValue(bool_value=flag)),
        st.integers(-(2**63), 2**63 - 1).map(lambda number: AnyValue(int_value=number)),
        st.floats(allow_nan=False).map(lambda number: AnyValue(double_value=number)),
        st.binary(max_size=6).map(lambda data: AnyValue(bytes_value=data)),
        st.integers(-(2**31), 2**31 - 1).map(lambda index: AnyValue(string_value_strindex=index)),
        st.just(AnyValue()),
    )


def _nested(inner: st.SearchStrategy[AnyValue]) -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        st.lists(inner, max_size=4).map(lambda values: AnyValue(array_value=ArrayValue(values=values))),
        st.lists(st.tuples(keys, inner), max_size=3).map(
            lambda pairs: AnyValue(
                kvlist_value=KeyValueList(values=[KeyValue(key=k, value=v) for k, v in pairs])
            )
        ),
    )


any_values = st.recursive(_leaf(), _nested, max_leaves=8)


@st.composite
def key_values(draw: st.DrawFn) -> KeyValue:
    key_value = KeyValue(key=draw(keys))
    if draw(st.integers(0, 19)):
        key_value.value.CopyFrom(draw(any_values))
    return key_value


def ids(length: int) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(min_size=length, max_size=length), st.binary(max_size=length + 1))


@st.composite
def spans(draw: st.DrawFn) -> Span:
    span = Span(
        trace_id=draw(ids(16)),
        span_id=draw(ids(8)),
        parent_span_id=draw(ids(8)),
        name=draw(texts),
        kind=draw(st.one_of(st.integers(0, 5), st.integers(-(2**31), 2**31 - 1))),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        trace_state=draw(texts),
        flags=draw(st.integers(0, 2**32 - 1)),
    )
    span.attributes.extend(draw(st.lists(key_values(), max_size=6)))
    for _ in range(draw(st.integers(0, 2))):
        span.events.add(name=draw(texts)).attributes.extend(draw(st.lists(key_values(), max_size=2)))
    for _ in range(draw(st.integers(0, 3))):
        link = span.links.add(trace_id=draw(ids(16)), span_id=draw(ids(8)))
        link.attributes.extend(draw(st.lists(key_values(), max_size=2)))
    if draw(st.booleans()):
        span.status.message = draw(texts)
        span.status.code = draw(st.integers(0, 2))
    return span


@st.composite
def requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        resource_spans: ResourceSpans = request.resource_spans.add()
        if draw(st.booleans()):
            resource_spans.resource.attributes.extend(draw(st.lists(key_values(), max_size=3)))
        for _ in range(draw(st.integers(0, 3))):
            scope_spans: ScopeSpans = resource_spans.scope_spans.add()
            if draw(st.integers(0, 9)):
                scope_spans.scope.name = draw(texts)
                scope_spans.scope.version = draw(texts)
                scope_spans.scope.attributes.extend(draw(st.lists(key_values(), max_size=2)))
            scope_spans.spans.extend(draw(st.lists(spans(), max_size=4)))
    return request


# --- what upb reads ------------------------------------------------------------------------------


def _value(value: AnyValue) -> object:
    case = value.WhichOneof("value")
    if case == "string_value":
        return value.string_value
    if case == "bool_value":
        return value.bool_value
    if case == "int_value":
        return value.int_value
    if case == "array_value":
        return [
            item.string_value if item.WhichOneof("value") == "string_value" else None
            for item in value.array_value.values
        ]
    return None


def upb_summary(raw: bytes, keys: Sequence[str]) -> tuple[list[object], list[object]]:
    """What ``decode_summary(raw, keys)`` must answer, read through the protobuf classes (upb)."""
    request = ExportTraceServiceRequest.FromString(raw)
    wanted = set(keys)
    scopes: list[object] = []
    found: list[object] = []
    for resource, resource_spans in enumerate(request.resource_spans):
        for scope_spans in resource_spans.scope_spans:
            scope = len(scopes)
            scopes.append((resource, scope_spans.scope.name, scope_spans.scope.version))
            for span in scope_spans.spans:
                found.append(
                    (
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        span.kind,
                        span.start_time_unix_nano,
                        scope,
                        [(link.trace_id, link.span_id) for link in span.links],
                        [(kv.key, _value(kv.value)) for kv in span.attributes if kv.key in wanted],
                    )
                )
    return scopes, found


# --- field orders --------------------------------------------------------------------------------

# (message, length-delimited field) -> the message that field holds
_CHILD = {
    ("request", 1): "resource_spans",
    ("resource_spans", 1): "resource",
    ("resource_spans", 2): "scope_spans",
    ("resource", 1): "key_value",
    ("scope_spans", 1): "scope",
    ("scope_spans", 2): "span",
    ("scope", 3): "key_value",
    ("span", 9): "key_value",
    ("span", 11): "event",
    ("span", 13): "link",
    ("event", 3): "key_value",
    ("link", 4): "key_value",
    ("key_value", 2): "any_value",
    ("any_value", 5): "array_value",
    ("any_value", 6): "key_value_list",
    ("array_value", 1): "any_value",
    ("key_value_list", 1): "key_value",
}


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, bytes, bytes | None]]:
    """The fields of a valid encoding: number, whole encoding, payload if length-delimited."""
    at = 0
    while at < len(data):
        start = at
        tag, at = _read_varint(data, at)
        number, wire = tag >> 3, tag & 7
        payload = None
        if wire == 0:
            _, at = _read_varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            length, at = _read_varint(data, at)
            payload, at = data[at : at + length], at + length
        else:
            raise AssertionError("protobuf's encoder writes no groups")
        yield number, data[start:at], payload


def reorder(data: bytes, rng: random.Random, message: str = "request") -> bytes:
    """``data`` with the fields of every message in a random order that keeps each field's
    repeats in order: the same message, as another encoder may write it."""
    groups: dict[int, list[bytes]] = {}
    for number, whole, payload in fields(data):
        child = _CHILD.get((message, number))
        if payload is not None and child is not None:
            inner = reorder(payload, rng, child)
            groups.setdefault(number, []).append(varint(number << 3 | 2) + varint(len(inner)) + inner)
        else:
            groups.setdefault(number, []).append(whole)
    queues = [list(reversed(group)) for group in groups.values()]
    out = bytearray()
    while queues:
        queue = rng.choice(queues)
        out += queue.pop()
        if not queue:
            queues.remove(queue)
    return bytes(out)
