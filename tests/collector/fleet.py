"""The scale-out tests' fleet: processor processes (:class:`Instance`) behind the real Collector's
loadbalancing exporter (``scaleout.yaml``), each forwarding to a store of its own (:class:`TimedSink`),
and a steady stream of loop traces sent in two requests, some seconds apart, through the Collector.

What a reader would not guess: an instance comes back on the ports it had (a restart, as a fleet's
orchestrator does it), so the Collector's static ring keeps routing its traces to it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from processor_helpers import EXPORT, Sink
from processor_spans import Trace, encode, guard_attributes
from prometheus_client.parser import text_string_to_metric_families
from test_collector_configs import collector
from test_collector_pipelines import config_for_test, free_port, wait_for_port

WAIT = 30.0

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def request_spans(raw: bytes) -> list[Any]:
    request = ExportTraceServiceRequest.FromString(raw)
    return [
        span
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]


class TimedSink(Sink):
    """A store that records when it stored each request, and may acknowledge it ``ack_delay`` later
    (written, not yet acknowledged: what a request in flight when its sender dies leaves behind)."""

    def __init__(self, ack_delay: float = 0.0) -> None:
        super().__init__()
        self.ack_delay = ack_delay
        self.times: list[float] = []
        self.stored = asyncio.Event()

    async def _export(
        self, into: list[bytes], raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        response = await super()._export(into, raw, context)
        if into is not self.received:  # metrics or logs: not spans stored
            return response
        self.times.append(time.monotonic())
        self.stored.set()
        await asyncio.sleep(self.ack_delay)
        return response

    def arrivals(self) -> list[tuple[float, bytes, bytes]]:
        """(when, trace id, span id) of every span stored."""
        return [
            (when, span.trace_id, span.span_id)
            for when, raw in zip(self.times, self.received, strict=True)
            for span in request_spans(raw)
        ]


class Instance:
    """``python -m otel_guard_processor`` on fixed ports (to come back on them), forwarding to a store."""

    trace_ttl = 6.0
    """``--trace-ttl``: past a trace's two requests' gap and the batches, short enough to settle in a test."""

    def __init__(self, tmp_path: Path, index: int, forward: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.forward = forward
        self.log = tmp_path / f"processor-{index}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.status: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def options(self) -> list[str]:
        """Its options after ``--listen`` and ``--forward``."""
        return [
            f"--prometheus=127.0.0.1:{self.metrics_port}",
            f"--trace-ttl={self.trace_ttl}",
            "--count-wait=0",  # each loop counted as it is seen: the scrape before the kill reads it
            "--drain-timeout=2",
        ]

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "otel_guard_processor",
            f"--listen={self.address}",
            f"--forward={self.forward}",
            *self.options(),
            "--log-level=warning",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)

    async def ready(self) -> float:
        """Wait until it serves; return when it did."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            assert self.process is not None
            assert self.process.poll() is None, self.log.read_text()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return time.monotonic()
        raise AssertionError(f"the processor did not listen on {self.port} within {WAIT} s")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 10 s); :attr:`status` is then its exit status, 0 for a graceful stop."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None:
            self.status = self.process.returncode

    async def scrape(self) -> Samples:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5)
        response.raise_for_status()
        samples: Samples = {}
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return samples


def cycles_of(samples: Samples) -> Counter[str]:
    """Loops counted, by kind."""
    found: Counter[str] = Counter()
    for labels, value in samples.get("otel_guard_cycles_total", {}).items():
        found[dict(labels)["kind"]] += int(value)
    return +found


def waiting(samples: Samples) -> float:
    return sum(samples.get("otel_guard_processor_waiting_spans", {}).values())


def loop_trace_in_two() -> tuple[bytes, bytes]:
    """planner → budget, then (later) budget → planner, refused: as the guard records it."""
    trace, root = Trace(), os.urandom(16).hex()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"], root), scope="otel_guard")
    budget = trace.agent(
        "budget", planner, attributes=guard_attributes(["planner", "budget"], root), scope="otel_guard"
    )
    refused = guard_attributes(["planner", "budget", "planner"], root, decision="refuse", reason="cycle")
    repeat = trace.agent("planner", budget, attributes=refused, scope="otel_guard")
    return encode(planner, budget), encode(repeat)


@asynccontextmanager
async def collector_in_front(tmp_path: Path, instances: list[Instance]) -> AsyncIterator[int]:
    """Start ``instances`` and the real Collector routing to them by trace id (``scaleout.yaml``);
    the Collector's OTLP/gRPC port. When the block ends the Collector is stopped (SIGTERM, then
    SIGKILL after 15 s), then every instance still running."""
    process: subprocess.Popen[str] | None = None
    try:
        for instance in instances:
            instance.start()
        for instance in instances:
            await instance.ready()
        port, http_port = free_port(), free_port()
        hosts = {f"otel-guard-processor-{n}:4317": i.address for n, i in enumerate(instances)}
        config = config_for_test(tmp_path, "scaleout", port, http_port, hosts)
        with (tmp_path / "collector.log").open("w") as log:
            process = subprocess.Popen(
                [collector(), f"--config={config}"], stdout=subprocess.DEVNULL, stderr=log, text=True
            )
        await wait_for_port(port, process)
        yield port
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for instance in instances:
            instance.stop()


class LoopStream:
    """What :func:`stream_loop_traces` sent: the traces, the spans the Collector accepted (how many
    times each), and the requests it refused."""

    def __init__(self) -> None:
        self.traces = 0
        self.accepted: Counter[bytes] = Counter()
        self.refused = 0


async def stream_loop_traces(
    port: int, *, tick: float, lag: int, seconds: float, chaos: Callable[[float], Awaitable[None]]
) -> LoopStream:
    """Send a loop trace (:func:`loop_trace_in_two`) every ``tick`` seconds for ``seconds`` to the
    Collector on ``port``, each trace's second request ``lag`` ticks after its first, while
    ``chaos(start)`` runs (it gets the stream's start, ``time.monotonic()``); return once every
    request was sent and ``chaos`` ended."""
    sent = LoopStream()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        send = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        later: list[bytes] = []
        start = time.monotonic()
        running = asyncio.ensure_future(chaos(start))
        tick_count = 0
        while True:
            batch: list[bytes] = []
            if time.monotonic() - start < seconds:
                first, second = loop_trace_in_two()
                sent.traces += 1
                batch.append(first)
                later.append(second)
            if len(later) > lag or (time.monotonic() - start >= seconds and later):
                batch.append(later.pop(0))
            if not batch:
                break
            for raw in batch:
                try:
                    await send(raw, timeout=10)
                except grpc.aio.AioRpcError:
                    sent.refused += 1
                    continue
                sent.accepted.update(span.span_id for span in request_spans(raw))
            tick_count += 1
            await asyncio.sleep(max(0.0, start + tick_count * tick - time.monotonic()))
        await running
    return sent
