"""The OTLP/gRPC and OTLP/HTTP receivers, driven by real clients on 127.0.0.1."""

from __future__ import annotations

import asyncio
import binascii
import gzip
import json

import grpc
import grpc.aio
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from otel_guard_processor.service import Processor
from processor_helpers import EXPORT, ProcessorFactory, Sink, export, grpc_address, http_url, scrape, series
from processor_spans import Trace, encode, request

CYCLES = "otel_guard_cycles_total"
SPANS = "otel_guard_processor_spans_total"
REQUESTS = "otel_guard_processor_requests_total"


def cycle_trace() -> Trace:
    trace = Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", trace.http_hop(planner))
    trace.agent("planner", trace.http_hop(budget))
    return trace


def otlp_json(message: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the specification writes it: camelCase keys, hex ids, enums as integers."""
    document = json_format.MessageToDict(message, use_integers_for_enums=True)
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = binascii.hexlify(binascii.a2b_base64(span[key])).decode()
    return json.dumps(document).encode()


async def test_grpc_stub_client_finds_the_cycle(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    trace = cycle_trace()
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        response = await stub.Export(request(*trace.spans), timeout=10)
    assert response == ExportTraceServiceResponse()
    samples = await scrape(processor)
    assert series(samples, CYCLES) == {("planner>budget>planner", "cross_function"): 1}
    assert series(samples, SPANS) == {("received",): 7}
    assert series(samples, REQUESTS) == {("ok", "grpc"): 1}


async def test_http_protobuf_and_json_find_the_same_cycles(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    as_protobuf, as_json = cycle_trace(), cycle_trace()
    async with httpx.AsyncClient() as client:
        first = await client.post(
            http_url(processor),
            content=encode(*as_protobuf.spans),
            headers={"Content-Type": "application/x-protobuf"},
        )
        second = await client.post(
            http_url(processor),
            content=otlp_json(request(*as_json.spans)),
            headers={"Content-Type": "application/json"},
        )
    assert first.status_code == 200
    assert first.headers["content-type"] == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(first.content) == ExportTraceServiceResponse()
    assert second.status_code == 200
    assert json.loads(second.content) == {}
    samples = await scrape(processor)
    # One cycle in each of two traces: counted once per trace.
    assert series(samples, CYCLES) == {("planner>budget>planner", "cross_function"): 2}
    assert series(samples, SPANS) == {("received",): 14}


async def test_http_json_ids_are_read_as_hex(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    trace = Trace()
    planner = trace.agent("planner")
    trace.agent("planner", planner)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=otlp_json(request(*trace.spans)),
            headers={"Content-Type": "application/json"},
        )
    assert response.status_code == 200
    # The parent link only holds if the hex ids were decoded to the same bytes.
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.cycles == {("direct", "planner>planner"): 1}


async def post_gzip(processor: Processor, body: bytes) -> httpx.Response:
    """POST a gzip-encoded protobuf body to the processor's OTLP/HTTP receiver."""
    async with httpx.AsyncClient() as client:
        return await client.post(
            http_url(processor),
            content=body,
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        )


async def test_http_gzip_body_is_accepted(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    response = await post_gzip(processor, gzip.compress(encode(*cycle_trace().spans)))
    assert response.status_code == 200
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.cycles == {("cross_function", "planner>budget>planner"): 1}


async def test_a_grpc_request_compressed_with_gzip_is_read_and_forwarded_as_received(
    start_processor: ProcessorFactory,
) -> None:
    """The OpenTelemetry Collector's OTLP exporter compresses with gzip unless told otherwise."""
    sink = Sink()
    await sink.start()
    try:
        processor = await start_processor(forward=sink.address)
        raw = encode(*cycle_trace().spans)
        async with grpc.aio.insecure_channel(
            grpc_address(processor), compression=grpc.Compression.Gzip
        ) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            await call(raw, timeout=10)
        await processor.detection.settled()
        assert processor.detector.cycles == {("cross_function", "planner>budget>planner"): 1}
        assert sink.received == [raw]  # the spans as sent, uncompressed
    finally:
        await sink.stop()


async def test_a_gzip_body_of_several_members_is_read_whole(start_processor: ProcessorFactory) -> None:
    # RFC 1952 allows members one after another (concatenating writers, some proxies send them):
    # every member's spans count, none is acknowledged short.
    processor = await start_processor()
    first, second = Trace(), Trace()
    planner = first.agent("planner")
    first.agent("planner", first.agent("budget", planner))
    raw = encode(*first.spans, *second.spans) + encode(second.agent("solo"))
    half = len(raw) // 2
    body = gzip.compress(raw[:half]) + gzip.compress(raw[half:])
    response = await post_gzip(processor, body)
    assert response.status_code == 200
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    samples = await scrape(processor)
    assert series(samples, SPANS)[("received",)] == 4


@pytest.mark.parametrize(
    "body",
    [
        gzip.compress(b"x" * 100)[:-4],  # the last member cut short
        gzip.compress(b"\n\x00") + gzip.compress(b"more")[:10],  # a second member cut short
        gzip.compress(b"\n\x00") + b"trailing garbage",
    ],
)
async def test_a_gzip_body_that_is_cut_short_or_trails_garbage_is_400(
    start_processor: ProcessorFactory, body: bytes
) -> None:
    processor = await start_processor()
    response = await post_gzip(processor, body)
    assert response.status_code == 400
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.active_traces == 0


async def test_malformed_protobuf_is_invalid_argument_and_changes_nothing(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor()
    await export(processor, encode(*cycle_trace().spans))
    before = await scrape(processor)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, b"\x0a\xff\xff\xff\xff\x0f garbage")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ExportTraceServiceRequest" in (caught.value.details() or "")
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor), content=b"\x12\x05abc", headers={"Content-Type": "application/x-protobuf"}
        )
    assert response.status_code == 400
    assert status_pb2.Status.FromString(response.content).code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    after = await scrape(processor)
    for name in (CYCLES, SPANS, "otel_guard_delegations_total", "otel_guard_processor_active_traces"):
        assert series(after, name) == series(before, name)
    assert series(after, REQUESTS) == {("ok", "grpc"): 1, ("invalid", "grpc"): 1, ("invalid", "http"): 1}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}', "not hex"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": '
            b'[{"traceId": "0102", "spanId": "0102030405060708"}]}]}]}',
            "must be 16 bytes",
        ),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 5}]}]}]}', "ExportTraceServiceRequest"),
        # An integer past Python's limit for converting digits (4300): a ValueError, not a 500.
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": ' + b"9" * 5000 + b"}]}]}]}", "not JSON"),
        (b"\xff\xfe{}", "not JSON"),
    ],
)
async def test_malformed_json_is_400_with_a_reason(
    start_processor: ProcessorFactory, body: bytes, message: str
) -> None:
    processor = await start_processor()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor), content=body, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400
    status = json.loads(response.content)
    assert message in status["message"]
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.active_traces == 0


async def test_oversized_requests_are_refused(start_processor: ProcessorFactory) -> None:
    processor = await start_processor(max_request_bytes=4096)
    trace = Trace()
    parent = trace.agent("planner")
    for _ in range(50):
        parent = trace.span("step " + "x" * 40, parent)
    raw = encode(*trace.spans)
    assert 4096 < len(raw) < 8192
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, raw)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_request_bytes" in (caught.value.details() or "")
    # Past twice the limit gRPC itself refuses it, before the processor reads it.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, raw * 2)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    async def chunks() -> object:
        for start in range(0, len(raw), 1000):  # no Content-Length: the limit is hit while reading
            yield raw[start : start + 1000]

    async with httpx.AsyncClient() as client:
        declared = await client.post(
            http_url(processor), content=raw, headers={"Content-Type": "application/x-protobuf"}
        )
        streamed = await client.post(
            http_url(processor), content=chunks(), headers={"Content-Type": "application/x-protobuf"}
        )
        bomb = await client.post(
            http_url(processor),
            content=gzip.compress(b"\0" * 1_000_000),
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        )
    assert (declared.status_code, streamed.status_code, bomb.status_code) == (413, 413, 413)
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.active_traces == 0
    samples = await scrape(processor)
    assert series(samples, REQUESTS) == {("too_large", "grpc"): 1, ("too_large", "http"): 3}
    assert series(samples, SPANS) == {}


async def test_unsupported_content_type_and_encoding_are_415(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    async with httpx.AsyncClient() as client:
        text = await client.post(
            http_url(processor), content=b"hello", headers={"Content-Type": "text/plain"}
        )
        brotli = await client.post(
            http_url(processor),
            content=b"hello",
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "br"},
        )
        wrong_method = await client.get(http_url(processor))
    assert (text.status_code, brotli.status_code, wrong_method.status_code) == (415, 415, 405)


async def test_bad_gzip_is_400(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=gzip.compress(encode(*cycle_trace().spans))[:-12],
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
        )
    assert response.status_code == 400
    await processor.detection.settled()  # detection runs after the answer
    assert processor.detector.active_traces == 0


async def test_a_body_that_never_finishes_is_408_and_its_connection_closed(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor(read_timeout=0.5)
    assert processor.http is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", processor.http.port)
    try:
        writer.write(
            b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 1000\r\n\r\n" + b"\n\x00" * 5
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)  # read() returns at EOF: closed
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert b"read_timeout" in answer
    samples = await scrape(processor)
    assert series(samples, REQUESTS) == {("timeout", "http"): 1}
