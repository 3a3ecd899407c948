"""Spans whose KeyValues are written value first, as the OpenTelemetry Collector writes them.

Go's pdata marshals a KeyValue's ``value`` field before its ``key`` (protobuf allows fields in any
order); the Python SDK writes the key first. The processor reads attributes from the encoding, so
both orders must read alike. The recorded corpus is re-encoded value first here, by hand (a protobuf
library would write the fields back in order), and must count exactly what it counts as recorded.
``tests/collector`` proves the same through the real Collector.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from corpus_spans import CORPUS, read_spans, to_request, to_span
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.engine import EngineDetector, decode_summary
from processor_spans import length_delimited, value_first
from test_corpus import detect

BESIDE = CORPUS / "beside"
RECORDINGS = sorted(CORPUS.glob("*.spans.jsonl")) + sorted(BESIDE.glob("*.spans.jsonl"))


def value_first_request(records: list[dict[str, Any]]) -> bytes:
    """One request of ``records``, a ScopeSpans per scope, every span's attributes value first."""
    scopes: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        scopes.setdefault(record["scope"], []).append(record)
    scope_spans = b""
    for scope, members in scopes.items():
        body = length_delimited(1, length_delimited(1, scope.encode())) + b"".join(
            length_delimited(2, value_first(to_span(r))) for r in members
        )
        scope_spans += length_delimited(2, body)
    return length_delimited(1, scope_spans)


def test_an_attribute_written_value_first_reads_as_written_key_first() -> None:
    span = Span(name="x")
    span.attributes.add(key="otel_guard.decision").value.string_value = "refuse"
    span.attributes.add(key="otel_guard.chain.depth").value.int_value = 3
    encoded = value_first(span)
    assert encoded.index(b"refuse") < encoded.index(b"otel_guard.decision")  # the value first
    raw = length_delimited(1, length_delimited(2, length_delimited(2, encoded)))
    keys = ["otel_guard.decision", "otel_guard.chain.depth", "otel_guard.reason"]
    _, ((*_, attributes),) = decode_summary(raw, keys)
    assert attributes == [("otel_guard.decision", "refuse"), ("otel_guard.chain.depth", 3)]


@pytest.mark.parametrize(
    "path", RECORDINGS, ids=lambda path: f"{path.parent.name}/{path.name.split('.spans')[0]}"
)
def test_a_recording_written_value_first_counts_as_recorded(path: Path) -> None:
    records = read_spans(path)
    expected = detect([records])
    raw = value_first_request(records)
    assert raw != to_request(records).SerializeToString()
    detector = EngineDetector()
    detector.ingest(raw, 0.0)
    detector.expire(detector.limits.count_wait)
    assert (detector.cycles, detector.delegations, detector.decisions) == (
        expected.cycles,
        expected.delegations,
        expected.decisions,
    )
