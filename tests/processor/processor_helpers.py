"""Helpers of the processor tests: a real downstream sink, clients, /metrics reading.

Everything listens on 127.0.0.1 port 0; whoever starts a server stops it.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
from otel_guard_processor.service import Processor
from prometheus_client.parser import text_string_to_metric_families

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class Sink:
    """A downstream OTLP/gRPC receiver of every signal that records the raw bytes of every request
    it acks: traces in ``received``, metrics and logs in ``unread["metrics"]`` and ``unread["logs"]``."""

    max_receive_bytes = 64 * 1024 * 1024  # gRPC's receive limit: a Collector's default is 4 MiB

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.unread: dict[str, list[bytes]] = {"metrics": [], "logs": []}
        self.delay = 0.0
        self.fail_with: grpc.StatusCode | None = None
        self.refuse_if: Callable[[bytes], bool] | None = None  # INVALID_ARGUMENT for such a request
        self.response = b""
        self.arrived = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self._server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", self.max_receive_bytes)]
        )
        services = {SERVICE: self.received, METRICS_SERVICE: self.unread["metrics"],
                    LOGS_SERVICE: self.unread["logs"]}  # fmt: skip
        self._server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(
                    service, {"Export": grpc.unary_unary_rpc_method_handler(partial(self._export, into))}
                )
                for service, into in services.items()
            )
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _export(
        self, into: list[bytes], raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        self.arrived.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            await context.abort(self.fail_with, "the sink says no")
        if self.refuse_if is not None and self.refuse_if(raw):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the sink cannot read one of these")
        into.append(raw)
        return self.response


ProcessorFactory = Callable[..., Awaitable[Processor]]


def grpc_address(processor: Processor) -> str:
    assert processor.grpc is not None
    return f"127.0.0.1:{processor.grpc.port}"


def http_url(processor: Processor) -> str:
    assert processor.http is not None
    return f"http://127.0.0.1:{processor.http.port}/v1/traces"


async def export(processor: Processor, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send raw request bytes over a real gRPC channel; raises grpc.aio.AioRpcError on error."""
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        response: bytes = await call(raw, timeout=timeout)
        return response


async def run_guarded_app(app: Path, processor: Processor, timeout: float) -> list[Any]:
    """Run a test program that exports the real guard's spans to ``processor`` over OTLP/gRPC; the
    JSON objects it printed, a line each (what its guard refused). Its last batch may still be in
    the processor when it ends: :func:`settled` waits for it."""
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(app), grpc_address(processor)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


async def settled(processor: Processor, cycles: int) -> None:
    """Wait (10 s at most) until ``processor`` counted ``cycles`` loops and holds no request, then
    until the detection that runs after each answer is done."""
    for _ in range(100):
        if len(processor.detector.cycles) >= cycles and processor.stats.inflight == 0:
            break
        await asyncio.sleep(0.1)
    await processor.detection.settled()


async def scrape(processor: Processor) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """GET /metrics: sample name -> {sorted label pairs: value}."""
    assert processor.prometheus is not None
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{processor.prometheus.port}/metrics")
    response.raise_for_status()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def series(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str
) -> dict[tuple[str, ...], float]:
    """The samples of one metric as {label values in label-name order: value}, zeros left out."""
    found: dict[tuple[str, ...], float] = {}
    for labels, value in samples.get(name, {}).items():
        if value:
            found[tuple(v for _, v in labels)] = value
    return found


@contextmanager
def processor_process(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m otel_guard_processor --listen 127.0.0.1:0 *args``; yields it and its ready line
    (which names the ports it picked) once it serves, and kills it afterwards if it still runs."""
    command = [sys.executable, "-m", "otel_guard_processor", "--listen", "127.0.0.1:0", *args]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        yield process, process.stderr.readline()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def ready_port(ready: str, what: str) -> int:
    """The port the ready line gives for ``what`` ("OTLP/gRPC", "metrics")."""
    found = re.search(re.escape(what) + r" on 127\.0\.0\.1:(\d+)", ready)
    assert found, ready
    return int(found.group(1))
