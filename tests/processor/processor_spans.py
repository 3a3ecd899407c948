"""Building OTLP spans and requests for the processor's tests, with the real OTLP protobuf types."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

INTERNAL = Span.SPAN_KIND_INTERNAL
SERVER = Span.SPAN_KIND_SERVER
CLIENT = Span.SPAN_KIND_CLIENT
PRODUCER = Span.SPAN_KIND_PRODUCER
CONSUMER = Span.SPAN_KIND_CONSUMER

AttributeValue = str | int | float | bool | Sequence["AttributeValue"]


def any_value(value: AttributeValue) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    return AnyValue(array_value=ArrayValue(values=[any_value(item) for item in value]))


class Trace:
    """Spans of one trace; ``span()`` returns the new span so children can name it as parent."""

    def __init__(self, trace_id: bytes | None = None) -> None:
        self.trace_id = trace_id or os.urandom(16)
        self.spans: list[Span] = []

    def span(
        self,
        name: str,
        parent: Span | None = None,
        *,
        kind: int = INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
        links: Iterable[Span] = (),
        scope: str | None = None,
    ) -> Span:
        span = Span(
            trace_id=self.trace_id,
            span_id=os.urandom(8),
            parent_span_id=parent.span_id if parent is not None else b"",
            name=name,
            kind=kind,
            # Each span starts a microsecond after the one made before it (a child after its parent,
            # as clocks have it), so "the first return" of a loop is never a tie of span ids.
            start_time_unix_nano=1_700_000_000_000_000_000 + 1_000 * len(self.spans),
            end_time_unix_nano=1_700_000_000_100_000_000,
        )
        for key, value in (attributes or {}).items():
            span.attributes.append(KeyValue(key=key, value=any_value(value)))
        for linked in links:
            span.links.add(trace_id=linked.trace_id, span_id=linked.span_id)
        if scope is not None:
            SCOPE_OF[span.span_id] = scope
        self.spans.append(span)
        return span

    def agent(self, name: str, parent: Span | None = None, **kwargs: object) -> Span:
        """An ``invoke_agent`` span as the GenAI conventions name it."""
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
        attributes.update(kwargs.pop("attributes", None) or {})  # type: ignore[call-overload]
        return self.span(f"invoke_agent {name}", parent, attributes=attributes, **kwargs)  # type: ignore[arg-type]

    def tool(self, name: str, parent: Span | None = None, **kwargs: object) -> Span:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        attributes.update(kwargs.pop("attributes", None) or {})  # type: ignore[call-overload]
        return self.span(f"execute_tool {name}", parent, attributes=attributes, **kwargs)  # type: ignore[arg-type]

    def http_hop(self, parent: Span) -> Span:
        """An HTTP client span and the server span under it (two unnamed links); returns the server."""
        client = self.span("POST", parent, kind=CLIENT, attributes={"http.request.method": "POST"})
        return self.span("POST /a2a", client, kind=SERVER, attributes={"http.route": "/a2a"})


def guard_attributes(
    agents: Sequence[str], root: str = "ab" * 16, decision: str = "allow", reason: str | None = None
) -> dict[str, AttributeValue]:
    """The attributes the inline guard puts on a hop span (docs/spec.md §5)."""
    attributes: dict[str, AttributeValue] = {
        "otel_guard.chain.agents": list(agents),
        "otel_guard.chain.skills": [""] * len(agents),
        "otel_guard.chain.root": root,
        "otel_guard.chain.depth": len(agents),
        "otel_guard.name_depth": list(agents).count(agents[-1]),
        "otel_guard.decision": decision,
        "otel_guard.mode": "enforce",
    }
    if reason is not None:
        attributes["otel_guard.reason"] = reason
    return attributes


GUARD_SCOPE = "otel_guard"  # the inline guard's instrumentation scope
SCOPE_OF: dict[bytes, str] = {}  # span id -> the instrumentation scope a test gave it


def request(*spans: Span, service: str = "agents") -> ExportTraceServiceRequest:
    """One ExportTraceServiceRequest holding ``spans`` in the given order.

    A span goes in the scope its test gave it (``Trace.span(scope=...)``); else spans with
    ``otel_guard.*`` attributes go in the guard's instrumentation scope and the others in the scope
    ``tests``, as an instrumented process exports them.
    """
    message = ExportTraceServiceRequest()
    resource_spans = message.resource_spans.add()
    resource_spans.resource.attributes.append(
        KeyValue(key="service.name", value=AnyValue(string_value=service))
    )
    scopes: dict[str, list[Span]] = {}
    for span in spans:
        scope = SCOPE_OF.get(span.span_id)
        if scope is None:
            guarded = any(kv.key.startswith("otel_guard.") for kv in span.attributes)
            scope = GUARD_SCOPE if guarded else "tests"
        scopes.setdefault(scope, []).append(span)
    for scope, members in scopes.items():
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.name = scope
        scope_spans.spans.extend(members)
    return message


def encode(*spans: Span) -> bytes:
    return request(*spans).SerializeToString()


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (for encodings built by hand, such as value-first KeyValues)."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` (wire type 2), encoded by hand."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def value_first(span: Span) -> bytes:
    """The span's encoding with each of its attributes written value first, as the OpenTelemetry
    Collector (Go's pdata) writes them; a protobuf library would write them back key first."""
    rest = Span()
    rest.CopyFrom(span)
    del rest.attributes[:]
    reordered = b"".join(
        length_delimited(
            9, length_delimited(2, kv.value.SerializeToString()) + length_delimited(1, kv.key.encode())
        )
        for kv in span.attributes
    )
    return rest.SerializeToString() + reordered
