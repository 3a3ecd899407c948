"""Every shipped Collector config, live: agents → the real Collector → otel-guard processor(s) → the store.

``inline.yaml`` (Collector → processor → store), ``fanout.yaml`` (Collector → store and processor),
``scaleout.yaml`` (Collector → loadbalancing by trace id → three processors → store) and
``scaleout-by-chain.yaml`` (Collector → the guard's spans only → loadbalancing by chain root → three
processors, forwarding to the store here to show what passed) are run as they are, their
addresses aside (127.0.0.1 and free ports, and the Collector's own metrics off so that nothing else
listens). Guarded loop traces, and the third-party instrumentations' recorded
loops, go in over OTLP/gRPC: every span must reach the store exactly once, and the processors must
count each loop once between them -- reading the attributes as the Collector encodes them (Go's
pdata writes a KeyValue's value before its key).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import ClassVar

import grpc.aio
import pytest
import yaml
from corpus_spans import CORPUS, read_spans, to_request
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.service import Processor
from ports import free_port
from processor_helpers import EXPORT, Sink
from processor_spans import Trace, encode, guard_attributes
from test_collector_configs import ROOT, collector
from test_corpus import LOOP_EDGES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRACES = 20
SPANS_PER_TRACE = 3
WAIT = 30.0


def config_for_test(
    tmp_path: Path,
    name: str,
    grpc_port: int,
    http_port: int,
    hosts: dict[str, str],
    compression: str | None = None,
) -> Path:
    """The shipped config ``name`` with the test's addresses in place of the deployment's (``hosts``:
    the config's host:port -> the test's), and ``compression`` on the hop to the processors instead
    of the shipped ``none``, if given."""
    text = (ROOT / "processor" / "collector" / f"{name}.yaml").read_text(encoding="utf-8")
    if compression is not None:
        assert "compression: none" in text
        text = text.replace("compression: none", f"compression: {compression}")
    text = text.replace("0.0.0.0:4317", f"127.0.0.1:{grpc_port}").replace(
        "0.0.0.0:4318", f"127.0.0.1:{http_port}"
    )
    for deployed, local in hosts.items():
        assert deployed in text, deployed
        text = text.replace(deployed, local)
    config = yaml.safe_load(text)
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def loop_trace() -> tuple[bytes, list[bytes]]:
    """planner → budget → planner, as the inline guard records it (the last hop refused)."""
    trace, root = Trace(), os.urandom(16).hex()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"], root), scope="otel_guard")
    budget = trace.agent(
        "budget", planner, attributes=guard_attributes(["planner", "budget"], root), scope="otel_guard"
    )
    refused = guard_attributes(["planner", "budget", "planner"], root, decision="refuse", reason="cycle")
    trace.agent("planner", budget, attributes=refused, scope="otel_guard")
    return encode(*trace.spans), [span.span_id for span in trace.spans]


async def wait_for_port(port: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        assert process.poll() is None, (
            f"the Collector exited: {process.stderr.read() if process.stderr else ''}"
        )
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise AssertionError(f"the Collector did not listen on {port} within {WAIT} s")


def received_span_ids(sink: Sink) -> Counter[bytes]:
    ids: Counter[bytes] = Counter()
    for raw in sink.received:
        request = ExportTraceServiceRequest.FromString(raw)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                ids.update(span.span_id for span in scope_spans.spans)
    return ids


class Pipeline:
    """The Collector running a shipped config in front of otel-guard processors and a store.

    ``inline``: Collector → processor, which forwards to the store. ``fanout``: Collector → the store
    and the processor (a sink). ``scaleout``: Collector → loadbalancing by trace id → three
    processors, each forwarding to the store. ``scaleout-by-chain``: Collector → the spans with a
    chain root → loadbalancing by ``otel_guard.chain.root`` → three processors, each forwarding to
    the store (deployed, they are sinks; here the store shows what the tier let through).
    """

    INSTANCES: ClassVar[dict[str, int]] = {"inline": 1, "fanout": 1, "scaleout": 3, "scaleout-by-chain": 3}

    def __init__(self, tmp_path: Path, name: str = "inline", compression: str | None = None) -> None:
        self.tmp_path = tmp_path
        self.name = name
        self.compression = compression
        self.sink = Sink()
        self.processors: list[Processor] = []
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def processor(self) -> Processor:
        return self.processors[0]

    async def __aenter__(self) -> Pipeline:
        await self.sink.start()
        forward = None if self.name == "fanout" else self.sink.address
        for _ in range(self.INSTANCES[self.name]):
            processor = Processor(
                replace(
                    ProcessorConfig(),
                    listen="127.0.0.1:0",
                    prometheus=None,
                    forward=forward,
                    drain_timeout=5.0,
                )
            )
            await processor.start()
            self.processors.append(processor)
        addresses = [f"127.0.0.1:{p.grpc.port}" for p in self.processors if p.grpc is not None]
        hosts = {
            "inline": {"otel-guard-processor:4317": addresses[0]},
            "fanout": {"otel-guard-processor:4317": addresses[0], "tempo:4317": self.sink.address},
            "scaleout": {f"otel-guard-processor-{n}:4317": address for n, address in enumerate(addresses)},
            "scaleout-by-chain": {
                f"otel-guard-chains-{n}:4317": address for n, address in enumerate(addresses)
            },
        }[self.name]
        self.port, http_port = free_port(), free_port()
        config = config_for_test(self.tmp_path, self.name, self.port, http_port, hosts, self.compression)
        self.process = subprocess.Popen(
            [collector(), f"--config={config}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        await wait_for_port(self.port, self.process)
        return self

    async def send(self, raw: bytes) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            await export(raw, timeout=10)

    async def stored(self, expected: Counter[bytes]) -> Counter[bytes]:
        deadline = time.monotonic() + WAIT  # the Collector batches for up to 2 s
        while received_span_ids(self.sink) != expected and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # and what would come twice has come
        for processor in self.processors:
            await processor.detection.settled()
            # Every span is in: the counts still waiting for late spans (count_wait) are made.
            await processor.detection.run(partial(processor.detector.count_waiting, time.monotonic()))
        return received_span_ids(self.sink)

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for processor in self.processors:
            await processor.stop()
        await self.sink.stop()
        if self.process is not None and exc[0] is None:
            assert self.process.returncode == 0, self.process.stderr.read() if self.process.stderr else ""


async def test_third_party_loops_through_the_collector_count_as_they_do_directly(tmp_path: Path) -> None:
    loops = sorted(CORPUS.glob("*.loop.spans.jsonl"))
    async with Pipeline(tmp_path) as pipeline:
        sent: Counter[bytes] = Counter()
        for path in loops:
            records = read_spans(path)
            await pipeline.send(to_request(records).SerializeToString())
            sent.update(bytes.fromhex(record["span_id"]) for record in records)
        assert await pipeline.stored(sent) == sent
        assert pipeline.processor is not None
        detector = pipeline.processor.detector
        await pipeline.processor.detection.run(lambda: detector.expire(time.monotonic() + 11))  # tool edges
        assert detector.cycles == {("cross_function", "planner>budget>planner"): len(loops)}
        assert detector.delegations == {edge: count * len(loops) for edge, count in LOOP_EDGES.items()}


@pytest.mark.parametrize(
    ("config", "compression"),
    [*((name, None) for name in sorted(Pipeline.INSTANCES)), ("inline", "gzip")],
    ids=[*sorted(Pipeline.INSTANCES), "inline-gzip"],
)
async def test_agents_to_the_collector_to_the_processor_to_the_store(
    tmp_path: Path, config: str, compression: str | None
) -> None:
    """Each shipped config as it is (its hop to the processors uncompressed), and inline with the
    Collector's default gzip on that hop, as a config that leaves compression out has it."""
    async with Pipeline(tmp_path, config, compression) as pipeline:
        sent: Counter[bytes] = Counter()
        for _ in range(TRACES):
            raw, span_ids = loop_trace()
            await pipeline.send(raw)
            sent.update(span_ids)
        assert await pipeline.stored(sent) == sent  # every span, exactly once
        # Each loop counted once over the instances: every span of a trace reached one of them.
        cycles: Counter[tuple[str, str]] = Counter()
        decisions: Counter[tuple[str, str, str]] = Counter()
        for processor in pipeline.processors:
            cycles.update(processor.detector.cycles)
            decisions.update(processor.detector.decisions)
        assert cycles == {("cross_function", "planner>budget>planner"): TRACES}
        assert decisions == {
            ("allow", "", "planner"): TRACES,
            ("allow", "", "budget"): TRACES,
            ("refuse", "cycle", "planner"): TRACES,
        }
        if config.startswith("scaleout"):  # the load balancer spread the traces (or the trees)
            assert all(processor.detector.cycles for processor in pipeline.processors)
