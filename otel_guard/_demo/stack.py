"""``otel-guard demo --stack``: the Planner / Budget loop across two processes, seen by the processor.

What it starts, all on 127.0.0.1 and all stopped before it returns:

- a sink standing in for the trace store (an OTLP/gRPC service that keeps what it receives),
- ``otel-guard processor`` (in this process), forwarding to the sink,
- two agent processes (:mod:`otel_guard._demo.agent`), planner and budget, each an HTTP service
  behind the guard's ASGI middleware, signing their chains with one fresh key and exporting their
  spans to the processor over OTLP.

Then it asks the planner to plan, which asks the budget agent, which asks the planner back: refused
at the planner's door. It prints what the agents said, the processor's metrics and the trace the sink
received. It needs the ``processor`` extra and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from otel_guard._demo.agent import _post
from otel_guard.chain import generate_key
from otel_guard.settings import ENV

AGENTS = {"planner": "plan", "budget": "price"}  # agent -> skill
START_SECONDS = 20.0  # for an agent process to be ready (interpreter and imports: about a second)
SHOWN_METRICS = ("otel_guard_cycles_total", "otel_guard_delegations_total", "otel_guard_span_decisions_total")
NEXT = (
    "next: README.md, 'Guard the runtime you use' (an example per runtime, run the same way), then\n"
    "      'See every loop: the processor' (point your own exporters at it)"
)


def run_stack_demo() -> int:
    try:
        import grpc  # noqa: F401
        import otel_guard_processor  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        print(
            f"otel-guard demo --stack: needs the processor ({exc}); "
            "install it with: pip install ./processor '.[processor]' "
            "(from a checkout; building it needs a Rust toolchain)",
            file=sys.stderr,
        )
        return 1
    return asyncio.run(_run())


async def _run() -> int:
    from dataclasses import replace

    from otel_guard_processor.config import ProcessorConfig
    from otel_guard_processor.logs import TextFormatter
    from otel_guard_processor.service import Processor

    # The processor's own log line for each counted loop, as it writes it, among the demo's lines.
    shown = logging.StreamHandler(sys.stdout)
    shown.setFormatter(TextFormatter())
    processor_log = logging.getLogger("otel_guard_processor")
    processor_log.addHandler(shown)
    processor_log.propagate = False
    started = time.monotonic()
    sink = _Sink()
    await sink.start()
    # Every span is in before the demo reads the metrics, so no count need wait for late ones.
    config = replace(
        ProcessorConfig(),
        listen="127.0.0.1:0",
        prometheus=None,
        forward=sink.address,
        drain_timeout=5.0,
        count_wait=0.0,
    )
    processor = Processor(config)
    agents: dict[str, asyncio.subprocess.Process] = {}
    relays: list[asyncio.Task[None]] = []
    errors: dict[str, list[str]] = {}  # each agent's stderr, shown if the demo fails
    try:
        await processor.start()
        assert processor.grpc is not None
        endpoint = f"127.0.0.1:{processor.grpc.port}"
        kid, secret = generate_key()
        env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
        env.update({ENV["keys"]: f"{kid}:{secret}", "PYTHONUNBUFFERED": "1"})
        print(f"otel-guard processor on {endpoint}, forwarding to a trace store stand-in on {sink.address}")
        print(f"two agent processes, their chains signed with key {kid}:")
        urls = {}
        for agent, skill in AGENTS.items():
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "otel_guard._demo.agent", agent, skill, endpoint,
                env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            agents[agent] = process
            urls[agent] = f"http://127.0.0.1:{await _ready(agent, process)}"
            print(f"  {agent} (skill {skill}) on {urls[agent]}, pid {process.pid}")
            relays.append(asyncio.create_task(_relay(agent, process)))
            relays.append(asyncio.create_task(_keep(process, errors.setdefault(agent, []))))
        print("\nthe user asks the planner for a 3-day Lisbon trip:")
        status, reply = await asyncio.to_thread(
            _post, f"{urls['planner']}/ask", {"asks": 0, "peers": urls}, {}
        )
        await asyncio.sleep(0.1)  # the agents' last lines
        if status != 200:
            raise RuntimeError(f"the planner answered {status}: {reply}")
        print(f"planner's answer: {reply.get('answer')}")
        await _stop(agents)  # each sends its spans as it goes
        await asyncio.gather(*relays)
        await _until(lambda: sink.spans() >= 3, seconds=10.0)
        await processor.detection.settled()
        print("\nthe processor's metrics (what Prometheus scrapes from /metrics):")
        for line in await processor.detection.run(lambda: _metric_lines(processor)):
            print(f"  {line}")
        for cycle, trace_id, span_id in await processor.detection.run(lambda: _loop_traces(processor)):
            print(f"\nthe loop {cycle} closed in trace {trace_id}, at span {span_id}:")
            print(
                "  open it in your trace store by that id (Jaeger: /trace/<id>; Grafana: the exemplar "
                "dot on the dashboard's cycle panel links to it)"
            )
        print("\nthe trace, as the trace store received it:")
        for line in sink.tree():
            print(f"  {line}")
        print(f"\ndone in {time.monotonic() - started:.1f} s; every process it started has stopped.")
        print(NEXT)
        return 0
    except Exception as exc:
        print(f"otel-guard demo --stack: failed: {exc}", file=sys.stderr)
        for agent, lines in errors.items():
            for line in lines[-15:]:
                print(f"  [{agent}] {line}", file=sys.stderr)
        return 1
    finally:
        for relay in relays:
            relay.cancel()
        await _stop(agents)
        await processor.stop()
        await sink.stop()
        processor_log.removeHandler(shown)
        processor_log.propagate = True


async def _ready(agent: str, process: asyncio.subprocess.Process) -> int:
    """The port an agent process printed as ``ready PORT``."""
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), START_SECONDS)
    except TimeoutError:
        line = b""
    if not line.startswith(b"ready "):
        stderr = await process.stderr.read() if process.stderr is not None and process.returncode else b""
        raise RuntimeError(f"the {agent} process did not start: {(line + stderr).decode(errors='replace')}")
    return int(line.split()[1])


async def _relay(agent: str, process: asyncio.subprocess.Process) -> None:
    assert process.stdout is not None
    async for line in process.stdout:
        print(f"  [{agent}] {line.decode(errors='replace').rstrip()}")


async def _keep(process: asyncio.subprocess.Process, lines: list[str]) -> None:
    assert process.stderr is not None
    async for line in process.stderr:
        lines.append(line.decode(errors="replace").rstrip())


async def _stop(agents: dict[str, asyncio.subprocess.Process]) -> None:
    """SIGTERM each agent process (it sends its spans and exits); kill one that does not."""
    for process in agents.values():
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    for process in agents.values():
        try:
            await asyncio.wait_for(process.wait(), 10.0)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _until(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def _metric_lines(processor: Any) -> list[str]:
    from prometheus_client.exposition import generate_latest

    text = generate_latest(processor.registry).decode()
    return [
        line for line in text.splitlines() if line.startswith(SHOWN_METRICS) and not line.endswith(" 0.0")
    ]


def _loop_traces(processor: Any) -> list[tuple[str, str, str]]:
    """(cycle label, trace id, span id) of each counted loop: the exemplars of ``/metrics``."""
    found = []
    for family in processor.registry.collect():
        for sample in family.samples:
            if sample.name == "otel_guard_cycles_total" and sample.exemplar is not None:
                ids = sample.exemplar.labels
                found.append((sample.labels["cycle"], ids["trace_id"], ids["span_id"]))
    return found


class _Sink:
    """An OTLP/gRPC trace service that keeps what it receives: the demo's trace store."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self._server: Any = None
        self.address = ""

    async def start(self) -> None:
        import grpc.aio

        async def export(raw: bytes, context: Any) -> bytes:
            self.requests.append(raw)
            return b""

        handler = grpc.unary_unary_rpc_method_handler(export)
        service = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}
        )
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((service,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)

    def _spans(self) -> list[tuple[str, Any]]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []
        for raw in self.requests:
            request = ExportTraceServiceRequest.FromString(raw)
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "?",
                )
                for scope_spans in resource_spans.scope_spans:
                    found += [(service, span) for span in scope_spans.spans]
        return found

    def spans(self) -> int:
        return len(self._spans())

    def tree(self) -> list[str]:
        """The spans as a tree, each with its service and the guard's decision on it."""
        spans = self._spans()
        ids = {span.span_id for _, span in spans}
        children: dict[bytes, list[tuple[str, Any]]] = {}
        for service, span in spans:
            parent = span.parent_span_id if span.parent_span_id in ids else b""
            children.setdefault(parent, []).append((service, span))
        lines: list[str] = []

        def show(parent: bytes, depth: int) -> None:
            for service, span in sorted(
                children.get(parent, []), key=lambda item: item[1].start_time_unix_nano
            ):
                attributes = {a.key: a.value.string_value for a in span.attributes}
                decision = attributes.get("otel_guard.decision", "")
                reason = attributes.get("otel_guard.reason")
                said = f"{decision} ({reason})" if reason else decision
                lines.append(f"{'  ' * depth}{span.name}  [{service}]  {said}")
                show(span.span_id, depth + 1)

        show(b"", 0)
        return lines
