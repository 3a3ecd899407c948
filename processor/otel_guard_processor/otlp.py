"""Reading OTLP trace requests: the bytes in, the few facts detection needs out.

The processor forwards every request byte for byte, so it never has to rebuild one; it only has to
read it. It reads protobuf through a *view* of the OTLP schema: the same field numbers and types as
``opentelemetry.proto.trace.v1``, keeping only the fields detection uses, with span attributes
declared as a ``map<string, AnyValue>``. A map entry has the wire form of a ``KeyValue`` (key = 1,
value = 2), so the very same bytes parse, and upb gives a hash lookup of one attribute instead of a
Python loop over all of them -- the largest single cost of a straightforward reader.

OTLP/JSON (``Content-Type: application/json``) is converted to the protobuf form first: ids are hex
in OTLP/JSON (not base64 as in the protobuf JSON mapping), unknown fields are ignored as the OTLP
specification asks, and the protobuf encoding of the result is what is forwarded.

Every failure to read a request raises :class:`MalformedRequest` with a message that says what was
wrong; a request that raises changes nothing in the processor.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, cast

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2

__all__ = [
    "AnyValueView",
    "MalformedRequest",
    "RequestView",
    "SpanView",
    "json_to_protobuf",
    "parse_request",
    "spans_of",
]

TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8

# OTLP span kinds (opentelemetry.proto.trace.v1.Span.SpanKind).
KIND_SERVER = 2
KIND_CLIENT = 3
KIND_PRODUCER = 4
KIND_CONSUMER = 5


class MalformedRequest(ValueError):
    """The request is not a readable OTLP ExportTraceServiceRequest; the message says why."""


class AnyValueView(Protocol):
    """The parts of ``opentelemetry.proto.common.v1.AnyValue`` the processor reads."""

    string_value: str
    int_value: int

    @property
    def array_value(self) -> Any: ...

    def WhichOneof(self, name: str) -> str | None: ...


class LinkView(Protocol):
    trace_id: bytes
    span_id: bytes


class SpanView(Protocol):
    """One span as read through the view: ids, name, kind, attributes by key, links."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str
    kind: int

    @property
    def attributes(self) -> Mapping[str, AnyValueView]: ...

    @property
    def links(self) -> list[LinkView]: ...


class RequestView(Protocol):
    @property
    def resource_spans(self) -> Any: ...


def _view_file() -> descriptor_pb2.FileDescriptorProto:
    """The view schema: OTLP's trace messages cut down to what detection reads."""
    field = descriptor_pb2.FieldDescriptorProto
    optional, repeated = field.LABEL_OPTIONAL, field.LABEL_REPEATED
    file = descriptor_pb2.FileDescriptorProto(
        name="otel_guard_processor/otlp_view.proto",
        package="otel_guard_processor.view",
        syntax="proto3",
        dependency=["opentelemetry/proto/common/v1/common.proto"],
    )

    def add(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: int,
            label: int = optional, type_name: str = "") -> None:  # fmt: skip
        added = message.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            added.type_name = type_name

    link = file.message_type.add(name="Link")
    add(link, "trace_id", 1, field.TYPE_BYTES)
    add(link, "span_id", 2, field.TYPE_BYTES)

    span = file.message_type.add(name="Span")
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    add(entry, "key", 1, field.TYPE_STRING)
    add(entry, "value", 2, field.TYPE_MESSAGE, type_name=".opentelemetry.proto.common.v1.AnyValue")
    add(span, "trace_id", 1, field.TYPE_BYTES)
    add(span, "span_id", 2, field.TYPE_BYTES)
    add(span, "parent_span_id", 4, field.TYPE_BYTES)
    add(span, "name", 5, field.TYPE_STRING)
    # An enum in OTLP; read as its wire integer so an unknown kind is kept, not an error.
    add(span, "kind", 6, field.TYPE_INT32)
    attributes_entry = ".otel_guard_processor.view.Span.AttributesEntry"
    add(span, "attributes", 9, field.TYPE_MESSAGE, repeated, attributes_entry)
    add(span, "links", 13, field.TYPE_MESSAGE, repeated, ".otel_guard_processor.view.Link")

    scope_spans = file.message_type.add(name="ScopeSpans")
    add(scope_spans, "spans", 2, field.TYPE_MESSAGE, repeated, ".otel_guard_processor.view.Span")
    resource_spans = file.message_type.add(name="ResourceSpans")
    add(resource_spans, "scope_spans", 2, field.TYPE_MESSAGE, repeated,
        ".otel_guard_processor.view.ScopeSpans")  # fmt: skip
    request = file.message_type.add(name="ExportTraceServiceRequest")
    add(request, "resource_spans", 1, field.TYPE_MESSAGE, repeated,
        ".otel_guard_processor.view.ResourceSpans")  # fmt: skip
    return file


def _view_request_class() -> Any:
    pool = descriptor_pool.Default()
    # The view refers to OTLP's AnyValue: importing common_pb2 put its file in the default pool.
    pool.FindFileByName(common_pb2.DESCRIPTOR.name)
    try:
        pool.FindFileByName("otel_guard_processor/otlp_view.proto")
    except KeyError:
        pool.Add(_view_file())
    descriptor = pool.FindMessageTypeByName("otel_guard_processor.view.ExportTraceServiceRequest")
    return message_factory.GetMessageClass(descriptor)


_RequestViewClass: Any = _view_request_class()


def parse_request(raw: bytes) -> RequestView:
    """Parse the protobuf bytes of an ExportTraceServiceRequest into the view."""
    try:
        return cast(RequestView, _RequestViewClass.FromString(raw))
    except DecodeError as exc:
        raise MalformedRequest(f"not an OTLP ExportTraceServiceRequest: {exc}") from None


def spans_of(request: RequestView) -> Iterator[SpanView]:
    """Every span of the request, in request order."""
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            yield from scope_spans.spans


# --- OTLP/JSON ------------------------------------------------------------------------------

_ID_FIELDS = (("traceId", TRACE_ID_BYTES), ("spanId", SPAN_ID_BYTES), ("parentSpanId", SPAN_ID_BYTES))


def json_to_protobuf(body: bytes) -> bytes:
    """Convert an OTLP/JSON ExportTraceServiceRequest to its protobuf encoding.

    Ids are hex strings in OTLP/JSON; they are checked for length and converted here, because the
    protobuf JSON mapping would read them as base64 and silently produce other ids.
    """
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedRequest(f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedRequest("an OTLP/JSON request must be a JSON object")
    for span in _json_spans(document):
        _hex_ids_to_base64(span, "span")
        links = span.get("links") or []
        if not isinstance(links, list):
            raise MalformedRequest("span.links must be a list")
        for link in links:
            if not isinstance(link, dict):
                raise MalformedRequest("each span link must be an object")
            _hex_ids_to_base64(link, "link")
    message = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise MalformedRequest(f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return message.SerializeToString()


def _json_spans(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("resourceSpans", "resource_spans"):
        for resource_spans in _json_list(document, key):
            for scope_key in ("scopeSpans", "scope_spans"):
                for scope_spans in _json_list(resource_spans, scope_key):
                    yield from _json_list(scope_spans, "spans")


def _json_list(parent: Any, key: str) -> list[dict[str, Any]]:
    if not isinstance(parent, dict):
        raise MalformedRequest(f"expected an object holding {key!r}")
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise MalformedRequest(f"{key} must be a list of objects")
    return value


def _hex_ids_to_base64(item: dict[str, Any], what: str) -> None:
    for camel, size in _ID_FIELDS:
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
        for key in (camel, snake):
            value = item.get(key)
            if value is None or value == "":
                continue
            if not isinstance(value, str):
                raise MalformedRequest(f"{what}.{camel} must be a hex string")
            try:
                decoded = binascii.unhexlify(value)
            except (binascii.Error, ValueError):
                raise MalformedRequest(f"{what}.{camel} is not hex: {value!r}") from None
            if len(decoded) != size:
                raise MalformedRequest(f"{what}.{camel} must be {size} bytes, got {len(decoded)}")
            item[key] = base64.b64encode(decoded).decode("ascii")
