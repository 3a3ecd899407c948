"""The processor next to a raw gRPC pass-through, on the same agent-like traffic, in one run.

Three processes on 127.0.0.1, started and stopped by this script:

* a counting sink (an OTLP/gRPC TraceService that acknowledges everything),
* the baseline: a raw pass-through proxy that parses each request (to count its spans) and
  forwards the bytes to the sink,
* ``otel-guard processor --forward <sink>`` (``python -m otel_guard_processor``).

The load generator (this process) keeps ``--concurrency`` requests in flight against one proxy at a
time, each request ``--traces`` traces of agent-like spans with new trace ids
(``bench/_processor_traffic.py``). Rounds alternate between the two proxies and the ratio is of the
medians, because this machine is shared and noisy. Beside spans/s it reports each proxy's own CPU
time per span, which the load elsewhere on the machine disturbs less.

Then fairness: for ``--fairness-seconds`` per proxy, one client sends one-trace requests one after
another, alone and then while another sends large requests (1,500 traces, ~6 MB) back to back; the
small requests' latency percentiles say how long one large request stalls the others.

Then a flood: a processor with ``--max-spans`` set low is sent new traces for ``--flood-seconds``;
its resident memory is sampled every half second and its evictions read from ``/metrics``. Last, in
process, the time to evict one trace whose spans all wait for parents that never come.

Usage: python bench/processor_throughput.py [--seconds 4] [--rounds 3] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import grpc.aio
import httpx
import psutil
from _processor_traffic import EXPORT, MIXES, Template, guarded

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
RETRY_AFTER = 0.05  # the processor's --retry-after here, and how long a refused sender waits


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def server(args: list[str], ready: str, stream: str) -> Iterator[subprocess.Popen[str]]:
    """Start a server process and wait for its ready line; stop it (SIGTERM, then kill) after."""
    process = subprocess.Popen(
        [PYTHON, *args],
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
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def load(target: str, template: Template, seconds: float, concurrency: int) -> int:
    """Keep ``concurrency`` requests in flight for ``seconds``; return the spans acknowledged."""
    acknowledged = 0
    deadline = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    ) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)

        async def worker() -> None:
            nonlocal acknowledged
            while time.monotonic() < deadline:
                raw, spans = template.next()
                await send(call, raw)
                acknowledged += spans

        await asyncio.gather(*(worker() for _ in range(concurrency)))
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


def caught_up(metrics_url: str | None) -> None:
    """Return once the processor has detected every request it acknowledged: a scrape waits for
    that (it runs after them on the detection thread)."""
    if metrics_url is not None:
        httpx.get(metrics_url, timeout=120).raise_for_status()


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def measure(
    name: str,
    target: str,
    pid: int,
    template: Template,
    seconds: float,
    concurrency: int,
    metrics_url: str | None,
) -> tuple[float, float]:
    """One round against one proxy: (spans per second, proxy CPU µs per span), up to the moment
    the processor has also detected every span it acknowledged."""
    process = psutil.Process(pid)
    cpu_before = cpu_seconds(process)
    started = time.perf_counter()
    spans = asyncio.run(load(target, template, seconds, concurrency))
    caught_up(metrics_url)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(process) - cpu_before
    rate = spans / elapsed
    per_span = cpu / spans * 1e6
    print(f"  {name:12s} {rate:10,.0f} spans/s   {per_span:5.2f} µs CPU a span", flush=True)
    return rate, per_span


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
    from otel_guard_processor.detector import Detector, DetectorLimits
    from otel_guard_processor.otlp import parse_request
    from processor_spans import Trace, encode

    for orphans in (1_000, 16_000):
        detector = Detector(DetectorLimits(trace_ttl=1.0))
        trace = Trace()
        spans = [trace.agent(f"agent-{index}") for index in range(orphans)]
        for index, span in enumerate(spans, start=1):
            span.parent_span_id = index.to_bytes(8, "big")
        raw = encode(*spans)
        detector.ingest(parse_request(raw), raw, 0.0)
        started = time.perf_counter()
        detector.expire(10.0)
        print(f"orphan eviction: {orphans:,} spans waiting for missing parents settled in "
              f"{(time.perf_counter() - started) * 1000:.0f} ms")  # fmt: skip


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per proxy")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--traces", type=int, default=40, help="traces per request")
    parser.add_argument(
        "--mix", choices=sorted(MIXES), default="dialects", help="the traffic (see _processor_traffic.py)"
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
        f"{os.cpu_count()} CPUs; requests of {template.spans} spans ({len(template.raw):,} bytes), "
        f"{args.concurrency} in flight, {args.rounds} rounds of {args.seconds:g} s per proxy"
    )
    sink_port, pass_port, proc_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    traffic = str(HERE / "_processor_traffic.py")
    with (
        server([traffic, "sink", "--port", str(sink_port)], "ready", "stdout"),
        server(
            [traffic, "passthrough", "--port", str(pass_port), "--forward", f"127.0.0.1:{sink_port}"],
            "ready",
            "stdout",
        ) as passthrough,
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
        ) as processor,
    ):
        arms = {
            "passthrough": (f"127.0.0.1:{pass_port}", passthrough.pid, None),
            "processor": (
                f"127.0.0.1:{proc_port}",
                processor.pid,
                f"http://127.0.0.1:{metrics_port}/metrics",
            ),
        }
        for target, _, _ in arms.values():  # warm up: connections, caches, allocator
            asyncio.run(load(target, template, 1.0, args.concurrency))
        rates: dict[str, list[float]] = {name: [] for name in arms}
        cpus: dict[str, list[float]] = {name: [] for name in arms}
        for round_number in range(1, args.rounds + 1):
            print(f"round {round_number}")
            for name, (target, pid, metrics_url) in arms.items():
                rate, cpu = measure(name, target, pid, template, args.seconds, args.concurrency, metrics_url)
                rates[name].append(rate)
                cpus[name].append(cpu)
        base, ours = statistics.median(rates["passthrough"]), statistics.median(rates["processor"])
        base_cpu, our_cpu = statistics.median(cpus["passthrough"]), statistics.median(cpus["processor"])
        print(f"median: passthrough {base:,.0f} spans/s, processor {ours:,.0f} spans/s")
        print(f"throughput ratio (processor / passthrough): {ours / base:.2f}   (goal >= 0.6)")
        print(
            f"CPU a span: passthrough {base_cpu:.2f} µs, processor {our_cpu:.2f} µs, "
            f"ratio {base_cpu / our_cpu:.2f}"
        )
        if args.fairness_seconds > 0:
            for name, (target, _, _) in arms.items():
                fairness(name, target, args.fairness_seconds)
        flood(sink_port, template, args.flood_seconds, args.concurrency, args.flood_max_spans)
    orphan_stall()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
