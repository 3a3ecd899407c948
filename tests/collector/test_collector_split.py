"""The processor forwarding to the real OpenTelemetry Collector, whose OTLP receiver takes at most
4 MiB a message by default: a 5 MiB request goes as parts, and every span reaches the store once.

Before, the Collector's RESOURCE_EXHAUSTED ("grpc: received message larger than max") was answered
to the client as retryable, and the request was retried for ever.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.service import Processor
from processor_helpers import Sink, export
from test_collector_configs import collector
from test_collector_pipelines import free_port, received_span_ids, wait_for_port
from test_split_forwarding import LIMIT, large_request, span_ids

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def test_a_request_over_the_collectors_default_limit_reaches_the_store_once(tmp_path: Path) -> None:
    sink = Sink()
    await sink.start()
    port = free_port()
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},  # default limit
        "exporters": {
            "otlp/store": {"endpoint": sink.address, "tls": {"insecure": True}, "compression": "none"}
        },
        "service": {
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["otlp/store"]}},
            "telemetry": {"metrics": {"level": "none"}},
        },
    }
    path = tmp_path / "collector.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    process = subprocess.Popen(
        [collector(), f"--config={path}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    processor = Processor(
        replace(ProcessorConfig(), listen="127.0.0.1:0", prometheus=None, forward=f"127.0.0.1:{port}")
    )
    try:
        await wait_for_port(port, process)
        await processor.start()
        raw = large_request(5 * 1024 * 1024)
        assert len(raw) > LIMIT
        response = ExportTraceServiceResponse.FromString(await export(processor, raw, timeout=15))
        assert response.partial_success.rejected_spans == 0
        expected = span_ids([raw])
        deadline = time.monotonic() + 20
        while received_span_ids(sink) != expected and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # and what would come twice has come
        assert received_span_ids(sink) == expected  # every span, once
        assert processor.forwarder is not None
        assert processor.forwarder.limit == LIMIT
    finally:
        await processor.stop()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        await sink.stop()
