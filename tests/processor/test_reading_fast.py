"""The fast ways of reading spans answer what the plain ways answer, on any encoding.

``read_call`` reads a dialect's kind by one lookup of its whole KeyValue and names by one search;
``string_of`` is ``Attributes.of(...).string`` without the object; the detector reads the spans of
the scopes it searches in the bytes they were received as (``parse_encoded_spans``), not in the
encoding the view makes of them. Each is checked here against the plain way: the dialect reader as
it was written before it was made fast (field by field, ``Attributes`` for every name), on spans of
random attributes written key first or value first, in any order and mixed.
"""

from __future__ import annotations

import otel_guard_processor.detector as detector_module
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor import dialects
from otel_guard_processor.detector import Detector, DetectorLimits, _encodings
from otel_guard_processor.dialects import (
    AGENT,
    FORM_GENAI,
    FORM_NAME,
    FORM_OPENINFERENCE,
    FORM_OPENINFERENCE_CHAIN,
    OPENINFERENCE_LANGCHAIN_SCOPE,
    TOOL,
    call_by_attributes,
    name_of_named_call,
    read_call,
)
from otel_guard_processor.otlp import (
    Attributes,
    attribute_key,
    key_first,
    parse_encoded_spans,
    parse_request,
    string_at,
    string_of,
)
from processor_spans import Trace, encode, length_delimited

# --- the dialect reader as it was, field by field: the reference -------------------------------


def reference_call(span_name: str, scope: str, encoded: bytes) -> tuple[object, ...] | None:
    bare = dialects._BARE_NAMES.get(span_name)
    if bare is not None:
        return (bare, name_of_named_call(span_name, Attributes.of(encoded)), FORM_NAME, False)
    ending = dialects._KIND_ENDING
    at = encoded.find(ending)
    operation_at: int | None = None
    if at < 0:
        operation_at = encoded.find(dialects._OPERATION)
        if operation_at < 0 and (dialects._KIND_TEXT in encoded or dialects._OPERATION_FIELD in encoded):
            encoded = key_first(encoded)
            at = encoded.find(ending)
            operation_at = encoded.find(dialects._OPERATION)
    while at >= 0:
        end = at + len(ending)
        if encoded.startswith(dialects._OI_KIND, at - dialects._OI_KIND_START):
            kind = string_at(encoded, end)
            if kind == dialects._OI_TOOL:
                tool = Attributes.of(encoded).string(dialects._OI_TOOL_NAME) or span_name
                return (TOOL, tool or None, FORM_OPENINFERENCE, False)
            if scope == OPENINFERENCE_LANGCHAIN_SCOPE:
                if kind == dialects._OI_CHAIN:
                    return (AGENT, span_name or None, FORM_OPENINFERENCE_CHAIN, True)
            elif kind == dialects._OI_AGENT:
                attributes = Attributes.of(encoded)
                agent = attributes.string(dialects._OI_AGENT_NAME) or attributes.string(
                    dialects._OI_GRAPH_NODE
                )
                return (AGENT, agent or None, FORM_OPENINFERENCE, False)
            break
        if encoded.startswith(dialects._TL_KIND, at - dialects._TL_KIND_START):
            row = dialects._TL_FORMS.get(string_at(encoded, end) or "")
            if row is not None:
                kind_of, form, conditional = row
                name = Attributes.of(encoded).string(dialects._TL_NAME) or None
                return (kind_of, name, form, conditional)
            break
        at = encoded.find(ending, end)
    if operation_at is None:
        operation_at = encoded.find(dialects._OPERATION)
    if operation_at >= 0:
        operation = string_at(encoded, operation_at + len(dialects._OPERATION)) or ""
        key = dialects._NAME_KEYS.get(operation)
        if key is not None:
            name = Attributes.of(encoded).string(key) or None
            return (dialects._BARE_NAMES[operation], name, FORM_GENAI, False)
    return None


# --- random spans ----------------------------------------------------------------------------

KINDS: list[str | int | bytes] = [
    "AGENT", "TOOL", "CHAIN", "LLM", "RETRIEVER", "agent", "workflow", "tool", "task", "unknown", 7,
]  # fmt: skip
OPERATIONS: list[str | int | bytes] = ["invoke_agent", "execute_tool", "invoke_workflow", "chat"]
NAMED: list[str | int | bytes] = ["planner", "", "x" * 200, 7, b"\xff\xfe"]
# Each key with the values it is tried with; any key may also hold any of OTHER.
KEYS: dict[str, list[str | int | bytes]] = {
    "openinference.span.kind": KINDS,
    "traceloop.span.kind": KINDS,
    "my.span.kind": KINDS,  # ends like a dialect's kind, is none
    "gen_ai.operation.name": OPERATIONS,
    "agent.name": NAMED,
    "graph.node.id": NAMED,
    "tool.name": NAMED,
    "traceloop.entity.name": NAMED,
    "gen_ai.agent.name": NAMED,
    "gen_ai.tool.name": NAMED,
    "gen_ai.workflow.name": NAMED,
    "input.value": ["x" * 200, "span.kind", "\n\x17openinference.span.kind\x12"],
    "otel_guard.decision": ["allow"],
}
OTHER: list[str | int | bytes] = ["", "span.kind", -1, 300, "x" * 300]
NAMES = ["planner", "", "invoke_agent", "execute_tool", "invoke_workflow", "ask", "invoke_agent x"]
SCOPES = [OPENINFERENCE_LANGCHAIN_SCOPE, "openinference.instrumentation.openai_agents", "tl"]


def any_value(value: str | int | bytes) -> bytes:
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value).SerializeToString()
    if isinstance(value, int):
        return AnyValue(int_value=value).SerializeToString()
    return AnyValue(string_value=value).SerializeToString()


@st.composite
def span_encodings(draw: st.DrawFn) -> tuple[str, bytes]:
    """A span's name and encoding: its header, then attributes in any order and field order."""
    name = draw(st.sampled_from(NAMES))
    encoded = Span(trace_id=b"t" * 16, span_id=b"s" * 8, name=name).SerializeToString()
    order = draw(st.sampled_from(["key first", "value first", "mixed"]))
    for _ in range(draw(st.integers(0, 6))):
        name_of_key = draw(st.sampled_from(sorted(KEYS)))
        key = length_delimited(1, name_of_key.encode())
        value = length_delimited(2, any_value(draw(st.sampled_from(KEYS[name_of_key] + OTHER))))
        value_first = order == "value first" or (order == "mixed" and draw(st.booleans()))
        encoded += length_delimited(9, value + key if value_first else key + value)
    if draw(st.booleans()):  # something else after the attributes: an event's attributes, say
        encoded += length_delimited(11, length_delimited(3, length_delimited(1, b"tool.name")))
    return name, encoded


def kv(key: str, value: str | int | bytes, value_first: bool = False) -> bytes:
    key_field = length_delimited(1, key.encode())
    value_field = length_delimited(2, any_value(value))
    return length_delimited(9, value_field + key_field if value_first else key_field + value_field)


OI, TL = "openinference.span.kind", "traceloop.span.kind"
CASES = [
    kv(OI, "AGENT") + kv("agent.name", ""),  # an empty agent name: the node id, looked up key first
    kv(OI, "AGENT") + kv("agent.name", "") + kv("graph.node.id", "n", value_first=True),
    kv(OI, "AGENT") + kv("agent.name", "a", value_first=True) + kv("graph.node.id", "n"),
    kv(OI, "AGENT") + kv("graph.node.id", "n", value_first=True),
    kv(OI, "AGENT") + kv("agent.name", 7) + kv("graph.node.id", "n"),
    kv(OI, "TOOL") + kv("tool.name", ""),
    kv(OI, "TOOL") + kv("tool.name", "t", value_first=True),
    kv(OI, "CHAIN"),
    kv(OI, "LLM") + kv("gen_ai.operation.name", "invoke_agent") + kv("gen_ai.agent.name", "a"),
    kv(OI, "LLM") + kv("gen_ai.operation.name", "invoke_agent", value_first=True),
    kv(OI, "AGENT", value_first=True) + kv("agent.name", "a"),
    kv(OI, "AGENT", value_first=True) + kv("gen_ai.operation.name", "execute_tool"),
    kv("my.span.kind", "TOOL") + kv(TL, "task") + kv("traceloop.entity.name", "e"),
    kv(TL, "task") + kv("traceloop.entity.name", ""),
    kv(TL, "task") + kv("traceloop.entity.name", "e", value_first=True),
    kv(TL, "tool") + kv(OI, "TOOL"),
    kv(TL, "unknown") + kv("gen_ai.operation.name", "execute_tool") + kv("gen_ai.tool.name", "t"),
    kv(TL, 7) + kv(TL, "agent"),
    kv("gen_ai.operation.name", "invoke_workflow") + kv("gen_ai.workflow.name", "w"),
    kv("gen_ai.operation.name", "invoke_agent", value_first=True) + kv("gen_ai.agent.name", "a"),
    kv("input.value", "span.kind") + kv("gen_ai.operation.name", "invoke_agent"),
    kv(OI, "x" * 200),
    kv(OI, "TOOL")[:-3],  # cut short
    # Written value first throughout, as the OpenTelemetry Collector writes spans.
    kv(OI, "AGENT", value_first=True) + kv("agent.name", "a", value_first=True),
    kv(OI, "AGENT", value_first=True)
    + kv("agent.name", "", value_first=True)
    + kv("graph.node.id", "n", True),
    kv(OI, "AGENT", value_first=True) + kv("agent.name", "a\x12b", value_first=True),  # the value's tag in it
    kv(OI, "AGENT", value_first=True)
    + kv("agent.name", "\x12\x03\n\x01x", value_first=True),  # a layout in it
    kv(OI, "AGENT", value_first=True) + kv("agent.name", "x" * 150, value_first=True),  # lengths of two bytes
    kv(OI, "AGENT", value_first=True) + kv("agent.name", "plänner", value_first=True),
    kv(OI, "AGENT", value_first=True) + kv("agent.name", b"\xff", value_first=True),
    kv(OI, "AGENT", value_first=True) + kv("agent.name", 7, value_first=True),
    kv(OI, "TOOL", value_first=True) + kv("tool.name", "t", value_first=True),
    kv(OI, "TOOL", value_first=True),
    kv(OI, "CHAIN", value_first=True)
    + kv("gen_ai.operation.name", "invoke_agent", value_first=True)
    + kv("gen_ai.agent.name", "a", value_first=True),
    kv(OI, "LLM", value_first=True),
    kv(OI, "LLM", value_first=True) + kv("gen_ai.operation.name", "chat", value_first=True),
    kv(OI, "x" * 200, value_first=True),
    kv(TL, "task", value_first=True) + kv("traceloop.entity.name", "e", value_first=True),
    kv(TL, "workflow", value_first=True) + kv("traceloop.entity.name", "w", value_first=True),
    kv("input.value", "\x12\x07\n\x05CHAIN\n\x17openinference.span.kind", True) + kv(OI, "TOOL", True),
    kv("gen_ai.operation.name", "execute_tool", value_first=True)
    + kv("gen_ai.tool.name", "t", value_first=True),
    kv("gen_ai.operation.name", "chat", value_first=True),
    kv("gen_ai.operation.name", 7, value_first=True),
    kv("gen_ai.operation.name", "x" * 150, value_first=True),
]


@pytest.mark.parametrize("attributes", CASES)
@pytest.mark.parametrize("scope", SCOPES)
def test_read_call_answers_what_the_field_by_field_reader_answers_on_the_edges(
    attributes: bytes, scope: str
) -> None:
    for name in ("x", "", "invoke_agent"):
        encoded = Span(trace_id=b"t" * 16, span_id=b"s" * 8, name=name).SerializeToString() + attributes
        assert read_call(name, scope, encoded) == reference_call(name, scope, encoded)


@settings(max_examples=3000, deadline=None)
@given(span_encodings(), st.sampled_from(SCOPES))
def test_read_call_answers_what_the_field_by_field_reader_answers(
    span: tuple[str, bytes], scope: str
) -> None:
    name, encoded = span
    expected = reference_call(name, scope, encoded)
    assert read_call(name, scope, encoded) == expected
    found = call_by_attributes(name, scope, encoded)
    assert (None if found is None else tuple(found)) == expected


class ReferenceAttributes:
    """How Attributes looks a key up: the key-first form, then the key alone."""

    def __init__(self, encoded: bytes) -> None:
        self.blob = encoded
        self.key_first = False

    def find(self, key: bytes) -> int:
        at = self.blob.find(key)
        if at >= 0:
            self.key_first = True
        elif not self.key_first and self.blob.find(key[:-1]) >= 0:
            self.blob = key_first(self.blob)
            self.key_first = True
            at = self.blob.find(key)
        return at


@settings(max_examples=1000, deadline=None)
@given(span_encodings(), st.sampled_from(sorted(KEYS)))
def test_string_of_answers_what_attributes_answered(span: tuple[str, bytes], key: str) -> None:
    encoded, encoded_key = span[1], attribute_key(key)
    reference = ReferenceAttributes(encoded)
    at = reference.find(encoded_key)
    expected = None if at < 0 else string_at(reference.blob, at + len(encoded_key))
    assert string_of(encoded, encoded_key) == expected
    assert Attributes.of(encoded).string(encoded_key) == expected


# --- the spans' own bytes --------------------------------------------------------------------


def test_the_spans_bytes_are_those_of_the_spans_the_view_reads() -> None:
    """Several resources and scopes, and a span written value first: each span's bytes, as
    received, hold what the view reads of it."""
    trace = Trace()
    planner = trace.agent("planner")
    spans = [planner, trace.tool("search", planner), trace.span("chat", planner)]
    first, second = encode(*spans[:2]), encode(spans[2])
    raw = first + second  # two ResourceSpans
    request = parse_request(raw)
    encoded = parse_encoded_spans(raw)
    assert encoded is not None
    for resource, resource_spans in enumerate(request.resource_spans):
        for scope, scope_spans in enumerate(resource_spans.scope_spans):
            viewed = list(scope_spans.spans)
            own = _encodings(encoded, resource, scope, len(viewed))
            assert own is not None
            for span, span_bytes in zip(viewed, own, strict=True):
                assert type(span).FromString(span_bytes) == span
    assert _encodings(encoded, 0, 0, 5) is None  # not the spans of that scope: not used
    assert _encodings(encoded, 7, 0, 1) is None


@pytest.mark.parametrize("apart", [True, False], ids=["spans-bytes", "view-encodings"])
def test_spans_of_a_searched_scope_read_alike_from_their_bytes_or_the_view(
    apart: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the spans' bytes cannot be read apart (they always can with upb, which reads both
    alike: forced here), the spans of a searched scope are searched in the view's encodings."""
    if not apart:
        monkeypatch.setattr(detector_module, "parse_encoded_spans", lambda raw: None)
    trace = Trace()
    oi = {"openinference.span.kind": "AGENT"}
    planner = trace.span("planner run", attributes={**oi, "agent.name": "planner"}, scope="oi.x")
    budget = trace.span("budget run", planner, attributes={**oi, "agent.name": "budget"}, scope="oi.x")
    trace.span("planner again", budget, attributes={**oi, "agent.name": "planner"}, scope="oi.x")
    raw = encode(*trace.spans)
    detector = Detector()
    detector.ingest(parse_request(raw), raw, 0.0)
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}


def test_each_span_of_a_searched_scope_is_read_in_its_own_bytes_past_skipped_spans() -> None:
    """Spans skipped (received again, their trace full) and spans named in the GenAI form, which
    are not searched, stand between the searched ones: each of those is still read in its own
    bytes."""
    oi = {"openinference.span.kind": "AGENT"}

    def agent(trace: Trace, name: str, parent: Span | None = None) -> Span:
        return trace.span(f"{name} run", parent, attributes={**oi, "agent.name": name}, scope="oi.x")

    detector = Detector(DetectorLimits(max_spans_per_trace=2))
    full = Trace()
    planner = agent(full, "planner")
    agent(full, "budget", planner)
    raw = encode(*full.spans)
    detector.ingest(parse_request(raw), raw, 0.0)
    again = planner  # received again
    dropped = agent(full, "audit", planner)  # its trace is full
    other = Trace()
    planner_2 = agent(other, "planner")
    named = other.span("invoke_agent budget", planner_2, scope="oi.x")  # read by its name
    agent(other, "planner", named)
    raw = encode(again, dropped, planner_2, named, other.spans[-1])
    detector.ingest(parse_request(raw), raw, 1.0)
    detector.expire(1.0 + detector.limits.tool_edge_wait)
    assert detector.duplicates == 1
    assert detector.dropped == {"trace_full": 1}
    assert detector.delegations == {("planner", "budget"): 2, ("budget", "planner"): 1}
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}


# --- the request's markers ----------------------------------------------------------------------


class _CountedSearches(bytes):
    """A request's bytes that count the whole-request searches for the dialects' markers."""

    searches = 0

    def find(self, sub: object, *args: object) -> int:  # type: ignore[override]
        if sub in dialects.MARKERS and not args:
            type(self).searches += 1
        return super().find(sub, *args)  # type: ignore[arg-type]


def _searches(detector: Detector, *spans: Span) -> int:
    raw = _CountedSearches(encode(*spans))
    _CountedSearches.searches = 0
    detector.ingest(parse_request(raw), raw, 0.0)
    return _CountedSearches.searches


def test_a_request_of_other_spans_is_searched_once_a_marker_and_a_run_of_one_dialect_once() -> None:
    """Most of a pipeline's spans are no calls (HTTP, databases): such a request costs one search
    of its bytes a marker. A run of requests of one dialect finds its marker at the first search,
    and the calls of a request of another are still read."""
    detector = Detector()
    plain = Trace()
    root = plain.span("GET /orders", kind=Span.SPAN_KIND_SERVER)
    plain.span("SELECT orders", root, kind=Span.SPAN_KIND_CLIENT)
    assert _searches(detector, *plain.spans) == len(dialects.MARKERS) == 3

    def oi_loop() -> list[Span]:
        trace = Trace()
        oi = {"openinference.span.kind": "AGENT"}
        planner = trace.span("planner run", attributes={**oi, "agent.name": "planner"}, scope="oi.x")
        budget = trace.span("budget run", planner, attributes={**oi, "agent.name": "budget"}, scope="oi.x")
        trace.span("planner again", budget, attributes={**oi, "agent.name": "planner"}, scope="oi.x")
        return trace.spans

    assert _searches(detector, *oi_loop()) == 3  # the kind's marker is the last one tried
    assert _searches(detector, *oi_loop()) == 1  # then the first
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 2}
    genai = Trace()
    parent: Span | None = None
    for agent in ("planner", "budget", "planner"):
        operation = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
        parent = genai.span("chat", parent, attributes=operation)
    assert _searches(detector, *genai.spans) == 2  # the hint, then invoke_
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 3}
