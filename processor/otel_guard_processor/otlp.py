"""OTLP/JSON trace requests to protobuf, and the error every unreadable request raises.

The processor forwards every request byte for byte and its engine reads the protobuf bytes
(:mod:`otel_guard_processor.engine`), so a protobuf request is never parsed here. OTLP/JSON
(``Content-Type: application/json``) is converted to the protobuf form first: ids are hex in
OTLP/JSON (not base64 as in the protobuf JSON mapping), unknown fields are ignored as the OTLP
specification asks, and the protobuf encoding of the result is what is forwarded.

Every failure to read a request raises :class:`MalformedRequest` with a message that says what was
wrong; a request that raises changes nothing in the processor.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["MalformedRequest", "hex_ids_to_base64", "json_to_protobuf"]

TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8


class MalformedRequest(ValueError):
    """The request is not a readable OTLP ExportTraceServiceRequest; the message says why."""


# --- OTLP/JSON ------------------------------------------------------------------------------

_ID_FIELDS = (("traceId", TRACE_ID_BYTES), ("spanId", SPAN_ID_BYTES), ("parentSpanId", SPAN_ID_BYTES))


def json_to_protobuf(body: bytes) -> bytes:
    """Convert an OTLP/JSON ExportTraceServiceRequest to its protobuf encoding.

    Ids are hex strings in OTLP/JSON; they are checked for length and converted here, because the
    protobuf JSON mapping would read them as base64 and silently produce other ids.
    """
    try:
        document = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise MalformedRequest(f"not JSON this processor reads: {str(exc)[:200]}") from None
    except RecursionError:
        raise MalformedRequest("not JSON this processor reads: nested too deeply") from None
    if not isinstance(document, dict):
        raise MalformedRequest("an OTLP/JSON request must be a JSON object")
    for span in _json_spans(document):
        hex_ids_to_base64(span, "span")
        links = span.get("links") or []
        if not isinstance(links, list):
            raise MalformedRequest("span.links must be a list")
        for link in links:
            if not isinstance(link, dict):
                raise MalformedRequest("each span link must be an object")
            hex_ids_to_base64(link, "link")
    message = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, RecursionError) as exc:
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


def hex_ids_to_base64(
    item: dict[str, Any], what: str, fields: tuple[tuple[str, int], ...] = _ID_FIELDS
) -> None:
    """OTLP/JSON's hex ids (``fields``: camelCase name and size in bytes; the snake_case spelling
    too) in ``item``, rewritten in place as the base64 protobuf's JSON mapping reads."""
    for camel, size in fields:
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
                raise MalformedRequest(f"{what}.{camel} is not hex: {value[:64]!r}") from None
            if len(decoded) != size:
                raise MalformedRequest(f"{what}.{camel} must be {size} bytes, got {len(decoded)}")
            item[key] = base64.b64encode(decoded).decode("ascii")
