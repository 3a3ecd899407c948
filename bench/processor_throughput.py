"""The processor next to a raw gRPC pass-through, on the same agent-like traffic, in one run.

Three processes on 127.0.0.1, started and stopped by this script:

* a counting sink (an OTLP/gRPC TraceService that acknowledges everything),
* the baseline: a raw pass-through proxy that parses each request (to count its spans) and
  forwards the bytes to the sink,
* ``otel-guard processor --forward <sink>`` (``python -m otel_guard_processor``).

The load generator (this process) keeps ``--concurrency`` requests in flight against one proxy at a
time, each request ``--traces`` traces of agent-like spans with new trace ids
(``bench/_processor_traffic.py``). Rounds alternate between the arms and the ratios are of the
medians, because this machine is shared and noisy. Beside spans/s it reports each proxy's own CPU
time per span, which the load elsewhere on the machine disturbs less.

With the OpenTelemetry Collector built by ``scripts/build-collector`` (``.collector/otelcol-otel-guard``;
``--collector PATH`` for another, ``--no-collector`` to leave it out -- a missing binary is said so,
never skipped in silence), two more arms on the same sink and traffic, in the same alternating
rounds, both running ``processor/collector/inline.yaml`` as shipped (OTLP receiver → ``batch`` →
OTLP exporter with its retry and sending queue), its addresses aside:

* ``collector``: the Collector as a pass-through, its exporter pointed at the sink;
* ``inline``: the inline deployment, the Collector's exporter pointed at the processor, whose
  ``--forward`` goes to the sink (the store, as inline.yaml ships it).

The Collector acknowledges a request once its batch processor has it, so what it acknowledges says
nothing of what got through: the sink counts the spans it receives, a round's rate is the spans the
sink had when the load ended (and the processors had detected what they received) over the
round's time, and the round then waits until every span sent is at the sink (the last partial batch
waits for the batch timeout, 2 s) -- or fails. Each process's CPU is counted until then, over the
spans sent. Behind a batch, its sender is held to at most ``--collector-window`` spans sent and not
at the sink yet (by default what ``--concurrency`` requests hold, as the other arms have in flight):
unbounded, it outruns what the Collector delivers. The plain pass-through acknowledges once the sink
has the spans, so it needs no such bound and its sender does not poll the sink. What is not at the
sink when the load ends is shown as a backlog, which the rate does not count.

On this 2-core machine the load generator and the sink spend about as much CPU a span as the
processor (the sink runs on the engine's HTTP/2 server, a grpcio sink spent more), so with every
process free to run anywhere (the default) spans/s ratios are of the sums of arm and harness.
``--pin`` gives each arm one core and the harness the other: with ``--concurrency`` high enough
that each arm keeps its core busy (each round prints the cores it kept busy; 64 for the figures in
docs/processor.md), an arm's spans/s is what it carries alone on one core.

Then fairness: for ``--fairness-seconds`` per proxy, one client sends one-trace requests one after
another, alone and then while another sends large requests (1,500 traces, ~6 MB) back to back; the
small requests' latency percentiles say how long one large request stalls the others.

Then a flood: a processor with ``--max-spans`` set low is sent new traces for ``--flood-seconds``;
its resident memory is sampled every half second and its evictions read from ``/metrics``. Last, in
process, the time to evict one trace whose spans all wait for parents that never come.

Usage: python bench/processor_throughput.py [--seconds 4] [--rounds 3] [--concurrency 8] [--no-collector]
       [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import psutil
import yaml
from _processor_traffic import COUNT, EXPORT, MIXES, Template, guarded
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
RETRY_AFTER = 0.05  # the processor's --retry-after here, and how long a refused sender waits
COLLECTOR = HERE.parent / ".collector" / "otelcol-otel-guard"
INLINE = HERE.parent / "processor" / "collector" / "inline.yaml"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _stop(process: subprocess.Popen[Any]) -> None:
    """End ``process``: SIGTERM, then SIGKILL after 10 s."""
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


EVERY_CPU = frozenset(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Cores:
    """Which CPUs the arms run on and which the harness (the load generator, this process, and the
    sink) runs on. Pinned, each arm has one core to itself and the harness the others, so an arm's
    spans/s is what it carries alone; shared, every process may run anywhere."""

    arm: frozenset[int]
    harness: frozenset[int]

    @classmethod
    def pinned(cls) -> Cores:
        cpus = sorted(EVERY_CPU)
        if len(cpus) < 2:
            raise SystemExit("--pin needs at least 2 CPUs (one for the arm, one for the harness)")
        return cls(frozenset(cpus[-1:]), frozenset(cpus[:-1]))

    @classmethod
    def shared(cls) -> Cores:
        return cls(EVERY_CPU, EVERY_CPU)

    def describe(self) -> str:
        if self.arm == self.harness:
            return "arms and harness share every CPU"
        arm, harness = (",".join(map(str, sorted(cpus))) for cpus in (self.arm, self.harness))
        return f"each arm pinned to CPU {arm}, the load generator and the sink to CPU {harness}"


def on(cpus: frozenset[int] | None, command: list[str]) -> list[str]:
    """``command`` to run on ``cpus`` (default: every CPU this script started with): as it is where
    this process runs on those already, else through ``taskset`` (util-linux), which execs it (the
    same pid). Only ``--pin`` needs it: a child inherits this process's CPUs, the harness's there."""
    chosen = EVERY_CPU if cpus is None else cpus
    if chosen == os.sched_getaffinity(0):
        return command
    return ["taskset", "--cpu-list", ",".join(map(str, sorted(chosen))), *command]


@contextmanager
def server(
    args: list[str], ready: str, stream: str, cpus: frozenset[int] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """Start a server process (on ``cpus``, default every CPU: :func:`on`) and wait for its ready
    line; stop it (SIGTERM, then kill) after."""
    process = subprocess.Popen(
        on(cpus, [PYTHON, *args]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=HERE.parent,
    )
    try:
        pipe = process.stdout if stream == "stdout" else process.stderr
        assert pipe is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = pipe.readline()
            if ready in line:
                break
            if not line and process.poll() is not None:
                raise RuntimeError(f"{args} exited: {process.stderr.read() if process.stderr else ''}")
        else:
            raise RuntimeError(f"{args} not ready in 30 s")
        yield process
    finally:
        _stop(process)


async def load(
    target: str,
    template: Template,
    seconds: float,
    concurrency: int,
    sink: str | None = None,
    window: int = 0,
) -> int:
    """Keep ``concurrency`` requests in flight for ``seconds``; return the spans acknowledged.

    With ``sink`` and ``window``, also hold back while more than ``window`` spans sent are not at
    the sink yet (polled every 2 ms): a Collector acknowledges what its batch processor took, so
    without this bound a sender outruns what it delivers and its queue grows for the whole round.
    """
    acknowledged = 0
    sent = 0
    delivered = 0
    deadline = time.monotonic() + seconds
    async with contextlib.AsyncExitStack() as stack:
        channel = await stack.enter_async_context(
            grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
        )
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        count = None
        if sink is not None and window > 0:
            sink_channel = await stack.enter_async_context(grpc.aio.insecure_channel(sink))
            count = sink_channel.unary_unary(COUNT, request_serializer=None, response_deserializer=None)
            base = delivered = int(await count(b"", timeout=10))

        async def worker() -> None:
            nonlocal acknowledged, sent
            while time.monotonic() < deadline:
                raw, spans = template.next()
                while count is not None and sent + spans - (delivered - base) > window:
                    await asyncio.sleep(0.001)
                    if time.monotonic() >= deadline:
                        return
                sent += spans
                await send(call, raw)
                acknowledged += spans

        async def poll() -> None:
            nonlocal delivered
            assert count is not None
            while time.monotonic() < deadline:
                delivered = int(await count(b"", timeout=10))
                await asyncio.sleep(0.002)

        await asyncio.gather(*(worker() for _ in range(concurrency)), *([poll()] if count else []))
    return acknowledged


async def send(call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes], raw: bytes) -> None:
    """Send until acknowledged, waiting RETRY_AFTER after each RESOURCE_EXHAUSTED, as exporters do
    (the processor refuses while its detection queue is full)."""
    while True:
        try:
            await call(raw, timeout=30)
            return
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            await asyncio.sleep(RETRY_AFTER)


def caught_up(metrics_url: str | None) -> str:
    """Return once the processor has detected every request it acknowledged: a scrape waits for
    that (it runs after them on the detection thread). Returns the scrape."""
    if metrics_url is None:
        return ""
    response = httpx.get(metrics_url, timeout=120)
    response.raise_for_status()
    return response.text


def _samples(metrics: str, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` whose labels include ``labels``, in a /metrics scrape."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def refused_spans(metrics: str) -> float:
    """The spans a processor refused (RESOURCE_EXHAUSTED or UNAVAILABLE: its sender sends them again)."""
    return _samples(metrics, "otel_guard_processor_spans_total", outcome="rejected")


def busy_requests(metrics: str) -> float:
    """The requests a processor refused as busy (``max_pending_bytes``): their sender sends them
    again, so the processor received their bytes more than once."""
    return _samples(metrics, "otel_guard_processor_requests_total", outcome="busy")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@dataclass
class Arm:
    """What one round sends to (``target``), the processes whose CPU it counts, and the processors
    on the way (their ``/metrics``, scraped to wait for their detection)."""

    target: str
    pids: dict[str, int]
    metrics_urls: list[str] = field(default_factory=list)
    window: int = 0  # at most these spans sent and not at the sink yet (0: no bound but the acks)


class Sink:
    """The counting sink's span count, read over gRPC, and its process (whose CPU is shown apart:
    it is the same for every arm but what the Collector compresses it must decompress)."""

    def __init__(self, address: str, pid: int) -> None:
        self.address = address
        self.process = psutil.Process(pid)
        self._channel = grpc.insecure_channel(address)
        self._count = self._channel.unary_unary(COUNT, request_serializer=None, response_deserializer=None)

    def spans(self) -> int:
        return int(self._count(b"", timeout=10))

    def close(self) -> None:
        self._channel.close()


def drained(sink: Sink, before: int, sent: int, patience: float) -> float:
    """Wait until the sink has the ``sent`` spans after ``before``; raise if it stops getting any
    for ``patience`` seconds (longer than a batch timeout) short of them, or gets more."""
    started = last_progress = time.monotonic()
    seen = sink.spans() - before
    while seen < sent:
        time.sleep(0.02)
        now = sink.spans() - before
        if now > seen:
            seen, last_progress = now, time.monotonic()
        elif time.monotonic() - last_progress > patience:
            raise RuntimeError(f"{sent - seen:,} of {sent:,} spans sent never reached the sink")
    if seen > sent:
        raise RuntimeError(f"the sink got {seen - sent:,} spans more than the {sent:,} sent")
    return time.monotonic() - started


@dataclass
class Round:
    rate: float  # spans at the sink a second
    cpu: dict[str, float]  # µs a span, by process
    backlog: int  # spans acknowledged but not at the sink when the load ended
    drain: float  # seconds after that until the last of them was
    sink_cpu: float  # the sink's µs a span
    load_cpu: float  # the load generator's (this process's) µs a span, while it sent


def measure(
    name: str, arm: Arm, template: Template, seconds: float, concurrency: int, sink: Sink, patience: float
) -> Round:
    """One round against one arm: spans at the sink a second up to the moment the load ended and
    every processor on the way had detected what it had received; then, once every span sent has
    reached the sink, each process's CPU µs a span."""
    processes = {label: psutil.Process(pid) for label, pid in arm.pids.items()}
    cpu_before = {label: cpu_seconds(process) for label, process in processes.items()}
    sink_before = cpu_seconds(sink.process)
    scrapes = [caught_up(url) for url in arm.metrics_urls]
    refused_before = sum(map(refused_spans, scrapes))
    busy_before = sum(map(busy_requests, scrapes))
    before = sink.spans()
    started = time.perf_counter()
    load_before = time.process_time()
    sent = asyncio.run(load(arm.target, template, seconds, concurrency, sink.address, arm.window))
    load_cpu = (time.process_time() - load_before) / sent * 1e6
    for url in arm.metrics_urls:
        caught_up(url)
    delivered = sink.spans() - before
    elapsed = time.perf_counter() - started
    drain = drained(sink, before, sent, patience)
    # and what came during the drain is detected too
    scrapes = [caught_up(url) for url in arm.metrics_urls]
    refused = sum(map(refused_spans, scrapes)) - refused_before
    busy = sum(map(busy_requests, scrapes)) - busy_before
    seconds = {label: cpu_seconds(p) - cpu_before[label] for label, p in processes.items()}
    cpu = {label: used / sent * 1e6 for label, used in seconds.items()}
    # how many cores the arm kept busy, from the first request to the last span at the sink
    cores_busy = sum(seconds.values()) / (time.perf_counter() - started)
    sink_cpu = (cpu_seconds(sink.process) - sink_before) / sent * 1e6
    rate = delivered / elapsed
    shown = " + ".join(f"{label} {value:.2f}" for label, value in cpu.items())
    total = f" = {sum(cpu.values()):.2f}" if len(cpu) > 1 else ""
    tail = f"   {cores_busy:.2f} cores busy"
    tail += f"   refused {refused:,.0f} spans (sent again)" if refused else ""
    tail += f"   {busy:,.0f} requests refused as busy (sent again)" if busy else ""
    tail += (
        f"   backlog {sent - delivered:,} spans, at the sink {drain:.1f} s later" if sent > delivered else ""
    )
    print(
        f"  {name:12s} {rate:10,.0f} spans/s   CPU a span: {shown}{total} µs "
        f"(sink {sink_cpu:.2f}, load {load_cpu:.2f}){tail}",
        flush=True,
    )
    return Round(rate, cpu, sent - delivered, drain, sink_cpu, load_cpu)


def seconds_of(duration: str) -> float:
    """A Collector duration (``2s``, ``200ms``) in seconds."""
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * scale
    raise ValueError(f"unknown duration {duration!r}")


def inline_config(
    directory: Path, name: str, exporter_to: str, plain: bool = False
) -> tuple[Path, str, float]:
    """``inline.yaml`` as shipped, on free 127.0.0.1 ports, its exporter sent to ``exporter_to``
    and the Collector's own metrics off (nothing else listens); ``plain``: without its ``batch``
    processor and its exporter's sending queue, so that a request is acknowledged once the
    downstream acknowledged it, as the processor does (receiver, exporter and compression as
    shipped). Returns the config, the OTLP/gRPC address and the batch timeout in seconds (0
    without a batch)."""
    grpc_port, http_port = free_port(), free_port()
    text = INLINE.read_text(encoding="utf-8")
    for deployed, local in {
        "0.0.0.0:4317": f"127.0.0.1:{grpc_port}",
        "0.0.0.0:4318": f"127.0.0.1:{http_port}",
        "otel-guard-processor:4317": exporter_to,
    }.items():
        if deployed not in text:
            raise RuntimeError(f"{INLINE} no longer has {deployed}: adapt the benchmark")
        text = text.replace(deployed, local)
    config = yaml.safe_load(text)
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}
    timeout = seconds_of(str(config["processors"]["batch"]["timeout"]))
    if plain:
        del config["processors"]
        config["service"]["pipelines"]["traces"].pop("processors")
        for exporter in config["exporters"].values():
            exporter["sending_queue"] = {"enabled": False}
        timeout = 0.0
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path, f"127.0.0.1:{grpc_port}", timeout


@contextmanager
def collector(
    binary: Path, config: Path, cpus: frozenset[int] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run the Collector (on ``cpus``; Go sizes GOMAXPROCS to them) until it logs that it is ready;
    stop it (SIGTERM, then kill) after. Its log goes to a file beside the config (a pipe nobody
    reads would fill and stall it)."""
    log_path = config.with_suffix(".log")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            on(cpus, [str(binary), f"--config={config}"]), stdout=subprocess.DEVNULL, stderr=log
        )
    try:
        deadline = time.monotonic() + 30
        while "Everything is ready" not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the Collector ({config.name}) did not start:\n{tail}")
            time.sleep(0.05)
        yield process
    finally:
        _stop(process)


def median_cpu(rounds: list[Round]) -> dict[str, float]:
    return {label: statistics.median(r.cpu[label] for r in rounds) for label in rounds[0].cpu}


def report(results: dict[str, list[Round]], pinned: bool) -> None:
    """Medians of each arm, and the ratios to the raw pass-through and the Collector pass-through."""
    rates = {name: statistics.median(r.rate for r in rounds) for name, rounds in results.items()}
    cpus = {name: median_cpu(rounds) for name, rounds in results.items()}
    totals = {
        name: statistics.median(sum(r.cpu.values()) for r in rounds) for name, rounds in results.items()
    }
    bases = [base for base in ("passthrough", "collector") if base in results]
    print("median of the rounds:")
    for name, rate in rates.items():
        shown = " + ".join(f"{label} {value:.2f}" for label, value in cpus[name].items())
        total = f" = {totals[name]:.2f}" if len(cpus[name]) > 1 else ""
        ratios = "".join(
            f"   / {base}: {rate / rates[base]:.2f}x spans/s, {totals[name] / totals[base]:.2f}x CPU"
            for base in bases
            if base != name
        )
        sink_cpu = statistics.median(r.sink_cpu for r in results[name])
        load_cpu = statistics.median(r.load_cpu for r in results[name])
        print(
            f"  {name:12s} {rate:10,.0f} spans/s   CPU a span: {shown}{total} µs "
            f"(sink {sink_cpu:.2f}, load {load_cpu:.2f}){ratios}"
        )
    ours, base = rates["processor"], rates["passthrough"]
    print(f"throughput ratio (processor / passthrough): {ours / base:.2f}   (goal >= 0.85)")
    if "collector" in results:
        print(
            f"the processor alone / the Collector pass-through: {ours / rates['collector']:.2f}x spans/s "
            f"(goal >= 2), {totals['processor'] / totals['collector']:.2f}x CPU a span; spans a CPU "
            f"second: {totals['collector'] / totals['processor']:.2f}x"
        )
        harness = {
            name: statistics.median(r.sink_cpu + r.load_cpu for r in results[name])
            for name in ("processor", "collector")
        }
        where = (
            "on a core of their own (--pin): where every arm kept its core busy, spans/s ratios are "
            "the arms' own"
            if pinned
            else "sharing the cores: where the cores are the bound, spans/s ratios are of the sums"
        )
        print(
            f"  the sink and the load generator: {harness['processor']:.2f} µs a span beside the "
            f"processor's {totals['processor']:.2f}, {harness['collector']:.2f} beside the Collector's "
            f"{totals['collector']:.2f}, {where}"
        )
    print(
        f"CPU a span: passthrough {totals['passthrough']:.2f} µs, processor {totals['processor']:.2f} µs, "
        f"ratio {totals['passthrough'] / totals['processor']:.2f}"
    )
    if "inline" in results:
        behind = cpus["inline"]["processor"]
        print(
            f"the processor behind the Collector: {behind:.2f} µs a span (alone {totals['processor']:.2f}); "
            f"inline / collector pass-through: {rates['inline'] / rates['collector']:.2f}x spans/s"
        )


async def small_latencies(target: str, seconds: float, large: Template | None) -> list[float]:
    """Latencies of one-trace requests sent one after another for ``seconds``, while (with
    ``large``) another client sends large requests back to back."""
    small = guarded(1)
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

        async def big() -> None:
            assert large is not None
            while time.monotonic() < deadline:
                await send(call, large.next()[0])

        flow = asyncio.ensure_future(big()) if large is not None else None
        await asyncio.sleep(0.2 if large is not None else 0)  # the first large request is in
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await send(call, small.next()[0])
            latencies.append(time.perf_counter() - started)
        if flow is not None:
            await flow
    return latencies


def fairness(name: str, target: str, seconds: float) -> None:
    """How long a small request waits while large ones flow (each large: 1,500 traces, ~6 MB)."""
    large = guarded(1500)
    alone = asyncio.run(small_latencies(target, seconds, None))
    beside = asyncio.run(small_latencies(target, seconds, large))

    def p(values: list[float], q: float) -> float:
        return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000

    print(
        f"  {name:12s} small request alone p50 {p(alone, 0.5):6.1f} ms p99 {p(alone, 0.99):6.1f} ms; "
        f"beside {large.spans:,}-span requests p50 {p(beside, 0.5):6.1f} ms p99 {p(beside, 0.99):6.1f} ms "
        f"max {max(beside) * 1000:6.0f} ms",
        flush=True,
    )


def orphan_stall() -> None:
    """In process: the eviction of one trace whose spans wait for distinct parents that never come."""
    sys.path.insert(0, str(HERE.parent / "tests" / "processor"))
    from otel_guard_processor.bounds import DetectorLimits
    from otel_guard_processor.engine import EngineDetector
    from processor_spans import Trace, encode

    for orphans in (1_000, 16_000):
        detector = EngineDetector(DetectorLimits(trace_ttl=1.0))
        trace = Trace()
        spans = [trace.agent(f"agent-{index}") for index in range(orphans)]
        for index, span in enumerate(spans, start=1):
            span.parent_span_id = index.to_bytes(8, "big")
        raw = encode(*spans)
        detector.ingest(raw, 0.0)
        started = time.perf_counter()
        detector.expire(10.0)
        print(f"orphan eviction: {orphans:,} spans waiting for missing parents settled in "
              f"{(time.perf_counter() - started) * 1000:.0f} ms")  # fmt: skip


HELD_PROGRAM = """
import os, sys
sys.path.insert(0, sys.argv[1])
from _processor_traffic import MIXES
from otel_guard_processor.bounds import DetectorLimits
from otel_guard_processor.engine import EngineDetector

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

template = MIXES[sys.argv[2]](int(sys.argv[3]))
first = [template.next()[0] for _ in range(200)]
then = [template.next()[0] for _ in range(int(sys.argv[4]))]
detector = EngineDetector(DetectorLimits(max_traces=10**6, max_spans=10**8, trace_ttl=1e9))
for raw in first:
    detector.ingest(raw, 0.0)
before, held = resident(), detector.stored_spans
for raw in then:
    detector.ingest(raw, 0.0)
print((resident() - before) / (detector.stored_spans - held), detector.stored_spans - held)
"""


def held_bytes(mix: str, traces: int, requests: int = 1000) -> None:
    """The engine's state per held span on the mix's traffic: the growth of a fresh process's
    resident set over ``requests`` requests, past 200 that pay for what is set up once, nothing
    evicted (the engine's memory is Rust's, out of tracemalloc's sight)."""
    done = subprocess.run(
        on(None, [PYTHON, "-c", HELD_PROGRAM, str(HERE), mix, str(traces), str(requests)]),
        capture_output=True,
        text=True,
        check=True,
        cwd=HERE.parent,
    )
    per_span, spans = done.stdout.split()
    print(f"held: {float(per_span):.0f} bytes a held span ({int(spans):,} spans of --mix {mix} held)")


def flood(sink_port: int, template: Template, seconds: float, concurrency: int, max_spans: int) -> None:
    grpc_port, metrics_port = free_port(), free_port()
    args = [
        "-m", "otel_guard_processor",
        "--listen", f"127.0.0.1:{grpc_port}",
        "--forward", f"127.0.0.1:{sink_port}",
        "--prometheus", f"127.0.0.1:{metrics_port}",
        "--max-spans", str(max_spans),
    ]  # fmt: skip
    with server(args, "ready:", "stderr") as process:
        watched = psutil.Process(process.pid)
        samples: list[tuple[float, float]] = []
        start_rss = watched.memory_info().rss / 2**20

        async def run() -> int:
            sent = asyncio.ensure_future(load(f"127.0.0.1:{grpc_port}", template, seconds, concurrency))
            begun = time.monotonic()
            while not sent.done():
                samples.append((time.monotonic() - begun, watched.memory_info().rss / 2**20))
                await asyncio.sleep(0.5)
            return await sent

        spans = asyncio.run(run())
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    evictions = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("otel_guard_processor_trace_evictions_total")
    )
    held = next(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("otel_guard_processor_held_spans ")
    )
    later = [rss for at, rss in samples if at >= seconds / 2]
    print(f"flood: {spans:,} spans in new traces over {seconds:g} s, --max-spans {max_spans:,}")
    print(f"  RSS at start {start_rss:.0f} MiB, peak {max(r for _, r in samples):.0f} MiB")
    print(f"  RSS over the second half: {min(later):.0f}-{max(later):.0f} MiB (flat when the cap holds)")
    print(f"  spans held at the end {held:,.0f}; traces evicted {evictions:,.0f}")
    print("  RSS every 0.5 s (MiB): " + " ".join(f"{rss:.0f}" for _, rss in samples))


def collector_binary(args: argparse.Namespace) -> Path | None:
    """The Collector to measure, or None -- said out loud -- when left out or missing."""
    if args.no_collector:
        print("Collector arms: left out (--no-collector)")
        return None
    binary = Path(args.collector)
    if not binary.is_file():
        message = (
            f"Collector arms NOT MEASURED: {binary} is missing "
            "(scripts/build-collector builds it; --collector PATH for another, "
            "--no-collector to leave them out)"
        )
        print(message, flush=True)
        print(message, file=sys.stderr, flush=True)
        return None
    return binary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per proxy")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--traces", type=int, default=40, help="traces per request")
    parser.add_argument(
        "--mix", choices=sorted(MIXES), default="dialects", help="the traffic (see _processor_traffic.py)"
    )
    parser.add_argument(
        "--collector",
        default=str(COLLECTOR),
        help="the OpenTelemetry Collector binary for the collector and inline arms (default: %(default)s)",
    )
    parser.add_argument("--no-collector", action="store_true", help="leave the Collector arms out")
    parser.add_argument(
        "--collector-pipeline",
        choices=["plain", "inline"],
        default="plain",
        help="the collector pass-through arm: plain (otlp receiver -> otlp exporter, no batch, no "
        "sending queue: acknowledged once the sink has it, as the processor) or inline.yaml as "
        "shipped (batch, sending queue) (default: %(default)s)",
    )
    parser.add_argument(
        "--collector-window",
        type=int,
        help="Collector arms: at most this many spans sent and not at the sink yet (default: what "
        "--concurrency requests hold, as in flight to the other arms; 0: as many as the Collector takes)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin each arm to one core and the load generator and the sink to the others, so that an "
        "arm's spans/s is what it carries alone on one core (raise --concurrency until every arm "
        "shows a busy core); default: every process may run on every CPU",
    )
    parser.add_argument("--flood-seconds", type=float, default=20.0)
    parser.add_argument(
        "--fairness-seconds", type=float, default=5.0, help="per proxy: small requests beside large ones"
    )
    parser.add_argument("--flood-max-spans", type=int, default=300_000)
    args = parser.parse_args()

    template = MIXES[args.mix](args.traces)
    about = " ".join((MIXES[args.mix].__doc__ or "").split())
    print(f"traffic --mix {args.mix}: {about}")
    print(
        f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"requests of {template.spans} spans ({len(template.raw):,} bytes), "
        f"{args.concurrency} in flight, {args.rounds} rounds of {args.seconds:g} s per arm"
    )
    binary = collector_binary(args)
    cores = Cores.pinned() if args.pin else Cores.shared()
    print(f"cores: {cores.describe()}")
    # This process is the load generator: on the harness's cores before gRPC starts any thread
    # (an affinity set later would hold only the thread that set it).
    os.sched_setaffinity(0, cores.harness)
    sink_port, pass_port, proc_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    traffic = str(HERE / "_processor_traffic.py")
    with ExitStack() as stack:
        sinking = stack.enter_context(
            server([traffic, "sink", "--port", str(sink_port)], "ready", "stdout", cores.harness)
        )
        sink = Sink(f"127.0.0.1:{sink_port}", sinking.pid)
        stack.callback(sink.close)
        passthrough = stack.enter_context(
            server(
                [traffic, "passthrough", "--port", str(pass_port), "--forward", f"127.0.0.1:{sink_port}"],
                "ready",
                "stdout",
                cores.arm,
            )
        )
        processor = stack.enter_context(
            server(
                [
                    "-m",
                    "otel_guard_processor",
                    "--listen",
                    f"127.0.0.1:{proc_port}",
                    "--forward",
                    f"127.0.0.1:{sink_port}",
                    "--prometheus",
                    f"127.0.0.1:{metrics_port}",
                    "--retry-after",
                    str(RETRY_AFTER),
                ],
                "ready:",
                "stderr",
                cores.arm,
            )
        )
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        arms = {
            "passthrough": Arm(f"127.0.0.1:{pass_port}", {"passthrough": passthrough.pid}),
            "processor": Arm(f"127.0.0.1:{proc_port}", {"processor": processor.pid}, [metrics_url]),
        }
        batch_timeout = 0.0
        if binary is not None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-collector-")))
            plain = args.collector_pipeline == "plain"
            alone, alone_at, alone_timeout = inline_config(
                directory, "collector", f"127.0.0.1:{sink_port}", plain
            )
            front, front_at, batch_timeout = inline_config(directory, "inline", f"127.0.0.1:{proc_port}")
            batch_timeout = max(batch_timeout, alone_timeout)
            pass_collector = stack.enter_context(collector(binary, alone, cores.arm))
            inline_collector = stack.enter_context(collector(binary, front, cores.arm))
            shown = INLINE.relative_to(HERE.parent) if INLINE.is_relative_to(HERE.parent) else INLINE
            version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
            print(
                f"Collector: {version.stdout.strip()}; collector -> sink: {shown} "
                + (
                    "without batch or sending queue (otlp receiver -> otlp exporter, compression none, "
                    "acknowledged once the sink acknowledged)"
                    if plain
                    else f"as shipped (batch timeout {batch_timeout:g} s)"
                )
                + f"; inline: collector ({shown} as shipped) -> processor -> sink"
            )
            window = (
                args.concurrency * template.spans if args.collector_window is None else args.collector_window
            )
            # Acknowledged once the sink has them, the plain pass-through cannot run ahead: polling
            # the sink for it would only spend the cores it shares (0.7 µs a span, measured).
            alone_window = 0 if plain and args.collector_window is None else window
            print(
                f"Collector arms: at most {window:,} spans sent and not at the sink yet"
                if window
                else "Collector arms: no bound on spans not at the sink yet (what the Collector takes)"
            )
            if alone_window != window:
                print(
                    "  (the plain pass-through: acknowledged once the sink has them, so no bound is needed)"
                )
            arms = {
                "passthrough": arms["passthrough"],
                "collector": Arm(alone_at, {"collector": pass_collector.pid}, window=alone_window),
                "processor": arms["processor"],
                "inline": Arm(
                    front_at,
                    {"collector": inline_collector.pid, "processor": processor.pid},
                    [metrics_url],
                    window,
                ),
            }
        patience = batch_timeout + 10.0
        for arm in arms.values():  # warm up: connections, caches, allocator
            before = sink.spans()
            sent = asyncio.run(load(arm.target, template, 1.0, args.concurrency, sink.address, arm.window))
            drained(sink, before, sent, patience)
            for url in arm.metrics_urls:
                caught_up(url)
        results: dict[str, list[Round]] = {name: [] for name in arms}
        for round_number in range(1, args.rounds + 1):
            print(f"round {round_number}")
            for name, arm in arms.items():
                results[name].append(
                    measure(name, arm, template, args.seconds, args.concurrency, sink, patience)
                )
        report(results, args.pin)
        if args.fairness_seconds > 0:
            for name in ("passthrough", "processor"):
                fairness(name, arms[name].target, args.fairness_seconds)
        flood(sink_port, template, args.flood_seconds, args.concurrency, args.flood_max_spans)
    held_bytes(args.mix, args.traces)
    orphan_stall()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
