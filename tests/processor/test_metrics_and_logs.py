"""Metrics and logs: an agent pointed at the processor sends all three signals, and the two it does
not read are forwarded as they came (or answered OK and counted, without a downstream)."""

from __future__ import annotations

import asyncio
import binascii
import json
import os
import sys
from pathlib import Path

import grpc
import grpc.aio
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from otel_guard_processor.service import Processor
from processor_helpers import ProcessorFactory, Sink, export, grpc_address, scrape, series
from processor_spans import encode
from test_forwarding import loop_trace, retry_delay

AGENT = Path(__file__).with_name("otlp_agent.py")
UNREAD = "otel_guard_processor_unread_requests_total"
REQUESTS = "otel_guard_processor_requests_total"
METRICS = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


async def run_agent(protocol: str, endpoint: str) -> dict[str, dict[str, list[str]]]:
    """Run otlp_agent.py against ``endpoint``; what it sent and the answers it got."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="10")
    agent = await asyncio.create_subprocess_exec(
        sys.executable, str(AGENT), protocol, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(agent.communicate(), 60)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert agent.returncode == 0, err.decode()[-3000:]
    result: dict[str, dict[str, list[str]]] = json.loads(out)
    return result


def sent(result: dict[str, dict[str, list[str]]], signal: str) -> list[bytes]:
    return [bytes.fromhex(raw) for raw in result["sent"][signal]]


async def grpc_export(processor: Processor, method: str, raw: bytes) -> bytes:
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        response: bytes = await call(raw, timeout=10)
        return response


def http_base(processor: Processor) -> str:
    assert processor.http is not None
    return f"http://127.0.0.1:{processor.http.port}"


@pytest.mark.integration
async def test_an_agents_metrics_and_logs_over_grpc_reach_the_downstream_byte_for_byte(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    result = await run_agent("grpc", f"http://{grpc_address(processor)}")
    assert result["answers"] == {"traces": ["OK"], "metrics": ["OK"], "logs": ["OK"]}
    metrics, logs = sent(result, "metrics"), sent(result, "logs")
    assert sink.unread == {"metrics": metrics, "logs": logs}
    assert sink.received == sent(result, "traces")
    # What was sent is what the agent recorded: its metric and its log line, in the span's trace.
    metric_names = [
        metric.name
        for resource in ExportMetricsServiceRequest.FromString(metrics[0]).resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    ]
    assert metric_names == ["agent.hops", "agent.latency"]
    record = ExportLogsServiceRequest.FromString(logs[0]).resource_logs[0].scope_logs[0].log_records[0]
    assert record.body.string_value == "budget asked for a three-day trip"
    assert len(record.trace_id) == 16
    samples = await scrape(processor)
    assert series(samples, UNREAD) == {("forwarded", "metrics"): 1, ("forwarded", "logs"): 1}
    assert series(samples, REQUESTS) == {("ok", "grpc"): 3}
    assert series(samples, "otel_guard_processor_spans_total") == {("forwarded",): 2, ("received",): 2}


@pytest.mark.integration
async def test_an_agents_metrics_and_logs_over_http_reach_the_downstream_byte_for_byte(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    result = await run_agent("http", http_base(processor))
    assert result["answers"] == {"traces": ["200"], "metrics": ["200"], "logs": ["200"]}
    assert sink.unread == {"metrics": sent(result, "metrics"), "logs": sent(result, "logs")}
    assert sink.received == sent(result, "traces")
    samples = await scrape(processor)
    assert series(samples, UNREAD) == {("forwarded", "metrics"): 1, ("forwarded", "logs"): 1}
    assert series(samples, REQUESTS) == {("ok", "http"): 3}


@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "http"])
async def test_without_forward_metrics_and_logs_are_answered_ok_and_counted(
    start_processor: ProcessorFactory, protocol: str
) -> None:
    processor = await start_processor()
    endpoint = f"http://{grpc_address(processor)}" if protocol == "grpc" else http_base(processor)
    result = await run_agent(protocol, endpoint)
    ok = "OK" if protocol == "grpc" else "200"
    assert result["answers"] == {"traces": [ok], "metrics": [ok], "logs": [ok]}
    samples = await scrape(processor)
    assert series(samples, UNREAD) == {("discarded", "metrics"): 1, ("discarded", "logs"): 1}
    assert series(samples, REQUESTS) == {("ok", protocol): 3}
    received = sum(len(raw) for signal in ("traces", "metrics", "logs") for raw in sent(result, signal))
    assert series(samples, "otel_guard_processor_received_bytes_total") == {(protocol,): received}


def otlp_json_logs(message: ExportLogsServiceRequest) -> bytes:
    """OTLP/JSON as the specification writes it: camelCase keys, hex ids, enums as integers."""
    document = json_format.MessageToDict(message, use_integers_for_enums=True)
    for resource in document["resourceLogs"]:
        for scope in resource["scopeLogs"]:
            for record in scope["logRecords"]:
                for key in ("traceId", "spanId"):
                    record[key] = binascii.hexlify(binascii.a2b_base64(record[key])).decode()
    return json.dumps(document).encode()


def metrics_request() -> ExportMetricsServiceRequest:
    """One counter with an exemplar (which carries a trace and a span id)."""
    message = ExportMetricsServiceRequest()
    metric = message.resource_metrics.add().scope_metrics.add().metrics.add(name="agent.hops")
    metric.sum.aggregation_temporality = 2
    metric.sum.is_monotonic = True
    point = metric.sum.data_points.add(as_int=3, time_unix_nano=1_700_000_000_000_000_000)
    point.exemplars.add(as_int=1, trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)))
    return message


async def test_otlp_json_metrics_and_logs_are_forwarded_as_protobuf_with_their_hex_ids(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    metrics = metrics_request()
    metrics_json = json_format.MessageToDict(metrics, use_integers_for_enums=True)
    point = metrics_json["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["sum"]["dataPoints"][0]
    point["exemplars"][0].update(traceId="0102030405060708090a0b0c0d0e0f10", spanId="0102030405060708")
    logs = ExportLogsServiceRequest()
    record = logs.resource_logs.add().scope_logs.add().log_records.add()
    record.body.string_value = "budget asked"
    record.trace_id, record.span_id = bytes(range(1, 17)), bytes(range(1, 9))
    sink.response = ExportMetricsServiceResponse(
        partial_success=ExportMetricsPartialSuccess(rejected_data_points=1, error_message="one too many")
    ).SerializeToString()
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            f"{http_base(processor)}/v1/metrics",
            content=json.dumps(metrics_json),
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 200
        # The downstream's own answer, in the request's content type.
        assert answer.json() == {
            "partialSuccess": {"rejectedDataPoints": "1", "errorMessage": "one too many"}
        }
        sink.response = b""
        answer = await client.post(
            f"{http_base(processor)}/v1/logs",
            content=otlp_json_logs(logs),
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 200
        assert ExportLogsServiceResponse() == json_format.Parse(answer.text, ExportLogsServiceResponse())
    assert [ExportMetricsServiceRequest.FromString(raw) for raw in sink.unread["metrics"]] == [metrics]
    assert [ExportLogsServiceRequest.FromString(raw) for raw in sink.unread["logs"]] == [logs]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/metrics", b"\x0a\xff\xff\xff\xff\x0f garbage", "not an OTLP ExportMetricsServiceRequest"),
        ("/v1/logs", b"\x12\x05abc", "not an OTLP ExportLogsServiceRequest"),
    ],
)
async def test_a_garbage_body_is_400_with_a_reason_and_the_processor_goes_on(
    start_processor: ProcessorFactory, sink: Sink, path: str, body: bytes, message: str
) -> None:
    processor = await start_processor(forward=sink.address)
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            f"{http_base(processor)}{path}", content=body, headers={"Content-Type": "application/x-protobuf"}
        )
        assert answer.status_code == 400
        status = status_pb2.Status.FromString(answer.content)
        assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert message in status.message
        answer = await client.post(
            f"{http_base(processor)}{path}",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 400
        assert "not JSON" in answer.json()["message"]
        good = metrics_request().SerializeToString()
        answer = await client.post(
            f"{http_base(processor)}/v1/metrics",
            content=good,
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert answer.status_code == 200
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await grpc_export(processor, METRICS if "metrics" in path else LOGS, body)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")
    assert sink.unread == {"metrics": [good], "logs": []}  # nothing malformed went on
    samples = await scrape(processor)
    assert series(samples, REQUESTS) == {("invalid", "http"): 2, ("ok", "http"): 1, ("invalid", "grpc"): 1}
    assert series(samples, UNREAD) == {("forwarded", "metrics"): 1}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/logs", {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]},
         "logRecord.traceId is not hex"),
        ("/v1/logs", {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"spanId": "0102"}]}]}]},
         "logRecord.spanId must be 8 bytes"),
        ("/v1/metrics", {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"gauge": {"dataPoints": [
            {"exemplars": [{"traceId": 5}]}]}}]}]}]}, "exemplar.traceId must be a hex string"),
        ("/v1/metrics", {"resourceMetrics": [{"scopeMetrics": [{"metrics": [{"name": 5}]}]}]},
         "not an OTLP/JSON ExportMetricsServiceRequest"),
        ("/v1/metrics", {"resourceMetrics": {"not": "a list"}}, "resourceMetrics must be a list of objects"),
        ("/v1/logs", [1, 2], "must be a JSON object"),
    ],
)  # fmt: skip
async def test_malformed_otlp_json_metrics_and_logs_are_400_with_a_reason(
    start_processor: ProcessorFactory, sink: Sink, path: str, body: object, message: str
) -> None:
    processor = await start_processor(forward=sink.address)
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            f"{http_base(processor)}{path}",
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
        )
    assert answer.status_code == 400
    assert message in answer.json()["message"]
    assert sink.unread == {"metrics": [], "logs": []}


async def test_metrics_are_acknowledged_only_after_the_downstream(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    processor = await start_processor(forward=sink.address)
    sink.delay = 0.5
    raw = metrics_request().SerializeToString()
    answering = asyncio.ensure_future(grpc_export(processor, METRICS, raw))
    await asyncio.wait_for(sink.arrived.wait(), 10)
    assert not answering.done()
    # Held while the downstream has it, twice over: the request and the forwarder's copy being sent.
    assert processor.stats.pending_bytes == 2 * len(raw)
    assert await answering == b""
    assert sink.unread["metrics"] == [raw]
    assert processor.stats.pending_bytes == 0


async def test_metrics_and_logs_follow_the_forwarding_rules_of_traces(
    start_processor: ProcessorFactory, sink: Sink
) -> None:
    """max_inflight counts every signal; requests held past max_pending_bytes are refused as busy
    before anything is forwarded; a downstream that is down is a retryable UNAVAILABLE."""
    raw = metrics_request().SerializeToString()  # framed as a logs request's too
    processor = await start_processor(forward=sink.address, max_inflight=1)
    sink.delay = 0.5
    first = asyncio.ensure_future(grpc_export(processor, LOGS, raw))
    await asyncio.wait_for(sink.arrived.wait(), 10)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await grpc_export(processor, METRICS, raw)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert retry_delay(caught.value) == 1.0
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, encode(*loop_trace().spans))  # traces wait behind logs too
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await first == b""
    samples = await scrape(processor)
    assert series(samples, "otel_guard_processor_downstream_errors_total") == {("busy",): 2}
    assert series(samples, UNREAD) == {("forwarded", "logs"): 1, ("rejected", "metrics"): 1}

    busy = await start_processor(forward=sink.address, max_pending_bytes=len(raw))
    sink.arrived.clear()
    first = asyncio.ensure_future(grpc_export(busy, METRICS, raw))
    await asyncio.wait_for(sink.arrived.wait(), 10)
    async with httpx.AsyncClient() as client:
        answer = await client.post(
            f"{http_base(busy)}/v1/logs", content=raw, headers={"Content-Type": "application/x-protobuf"}
        )
    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "1"
    assert await first == b""
    assert sink.unread == {"metrics": [raw], "logs": [raw]}  # the busy refusal went nowhere
    assert series(await scrape(busy), REQUESTS) == {("ok", "grpc"): 1, ("busy", "http"): 1}

    await sink.stop()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await grpc_export(busy, METRICS, raw)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert retry_delay(caught.value) == 1.0
    assert series(await scrape(busy), UNREAD) == {("forwarded", "metrics"): 1, ("rejected", "metrics"): 1}
