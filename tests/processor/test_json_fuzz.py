"""OTLP/JSON fuzzed: whatever the body, the conversion answers protobuf or a MalformedRequest (a
400), never anything else (a 500)."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otel_guard_processor.conversion import convert
from otel_guard_processor.otlp import MalformedRequest
from processor_helpers import ProcessorFactory, http_url

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FIELDS = [
    "resourceSpans",
    "scopeSpans",
    "spans",
    "traceId",
    "spanId",
    "parentSpanId",
    "name",
    "kind",
    "startTimeUnixNano",
    "endTimeUnixNano",
    "attributes",
    "key",
    "value",
    "stringValue",
    "intValue",
    "doubleValue",
    "boolValue",
    "arrayValue",
    "values",
    "kvlistValue",
    "bytesValue",
    "links",
    "events",
    "status",
    "code",
    "message",
    "resource",
    "scope",
    "version",
    "droppedAttributesCount",
    "flags",
    "traceState",
    "resourceMetrics",
    "scopeMetrics",
    "metrics",
    "gauge",
    "sum",
    "histogram",
    "dataPoints",
    "asInt",
    "asDouble",
    "aggregationTemporality",
    "isMonotonic",
    "resourceLogs",
    "scopeLogs",
    "logRecords",
    "body",
    "severityNumber",
    "severityText",
    "timeUnixNano",
]
SIGNALS = {"traces": "resourceSpans", "metrics": "resourceMetrics", "logs": "resourceLogs"}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["1e400", "-1", "0102030405060708", "00" * 16, "zz", "NaN", "Infinity", "\ud800"])
    | st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=25,
)


def otlp_shaped(signal: str) -> st.SearchStrategy[Any]:
    """A document with the signal's top-level list, so the fuzz reaches json_format's parse."""
    return st.dictionaries(st.just(SIGNALS[signal]), values, min_size=1) | values


def converts_or_refuses(signal: str, body: bytes) -> None:
    message = None
    try:
        assert isinstance(convert(signal, body), bytes)
    except MalformedRequest as exc:
        message = str(exc)  # a 400 saying why
    assert message is None or message


@SETTINGS
@given(st.sampled_from(sorted(SIGNALS)).flatmap(lambda s: st.tuples(st.just(s), otlp_shaped(s))))
def test_any_json_document_converts_or_is_malformed(case: tuple[str, Any]) -> None:
    signal, document = case
    converts_or_refuses(signal, json.dumps(document, allow_nan=True).encode("utf-8", "surrogatepass"))


VALID = (
    b'{"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": '
    b'"a"}}]}, "scopeSpans": [{"scope": {"name": "s"}, "spans": [{"traceId": '
    b'"0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708", "name": "invoke_agent planner", '
    b'"kind": 1, "startTimeUnixNano": "1700000000000000000", "attributes": [{"key": "gen_ai.agent.name", '
    b'"value": {"stringValue": "planner"}}, {"key": "n", "value": {"intValue": "5"}}], "links": '
    b'[{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708"}]}]}]}]}'
)


HOSTILE_NUMBERS = (b"1e400", b"-1e400", b"1e309", b"NaN", b"-Infinity", b"1.5", b"-0", b"9" * 25)


def mutated(rng: random.Random, body: bytes) -> bytes:
    if rng.random() < 0.3:  # a number no field holds where an enum or integer is read
        field = rng.choice([b'"kind": 1', b'"startTimeUnixNano": "1700000000000000000"', b'"intValue": "5"'])
        body = body.replace(field, field.split(b":")[0] + b": " + rng.choice(HOSTILE_NUMBERS))
        if rng.random() < 0.5:
            return body
    data = bytearray(body)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data))
        choice = rng.random()
        if choice < 0.4:
            data[at] = rng.randrange(256)
        elif choice < 0.7:
            data[at:at] = rng.choice([b"1e400", b"-", b"[", b"{", b'"', b"null", b"9" * 30, b"\xff"])
        else:
            del data[at : at + rng.randint(1, 8)]
    return bytes(data)


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_mutated_bodies_convert_or_are_malformed(rng: random.Random) -> None:
    converts_or_refuses("traces", mutated(rng, VALID))


async def test_no_json_body_is_a_500(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    rng = random.Random(41)
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=10) as client:
        for _ in range(60):
            body = mutated(rng, VALID)
            response = await client.post(
                http_url(processor), content=body, headers={"Content-Type": "application/json"}
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code in (200, 400), (body, response.content)
            if response.status_code == 400:
                assert json.loads(response.content)["message"]
    assert statuses.get(400, 0) >= 10, statuses


@pytest.mark.parametrize("signal", sorted(SIGNALS))
def test_the_valid_body_of_each_signal_converts(signal: str) -> None:
    body = VALID if signal == "traces" else json.dumps({SIGNALS[signal]: []}).encode()
    assert isinstance(convert(signal, body), bytes)
