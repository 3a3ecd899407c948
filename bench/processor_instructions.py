"""What the processor's detection costs a span, in instructions: repeatable on a noisy machine.

``bench/processor_throughput.py`` times the processor against a raw pass-through; on this shared
machine its ratios move with the load from run to run. This script counts the instructions the
detector (the compiled engine behind :class:`~otel_guard_processor.engine.EngineDetector`, with
the check the service makes of each request before it acknowledges it) executes instead, under valgrind's
callgrind, which does not depend on what else the
machine is doing (the same figures run after run). Each mix runs in a child process twice, with 0
and with ``--requests`` requests ingested after the same setup; the difference divided by their
spans is the cost a span.

The setup, the same whatever the count: the mix's traffic (``bench/_processor_traffic.py``, 40
traces a request, new trace ids every cycle, ids from a seeded generator and a fixed hash seed so
that every run reads the same bytes), the garbage collector frozen and tuned as
``otel-guard processor`` does, and ``--warm`` requests ingested first, so that
the detector holds ``--max-traces`` traces and evicts as traces come (its steady state under load).
Time moves 2 ms a request (about the benchmark's rate) and ``expire`` runs every second of it, as
the service's sweep does.

Instructions are not time everywhere (a cache miss is one instruction): ``--time`` also times the
same work natively (the best of ``--repeat`` runs, nanoseconds a span), to weigh a change.

Usage: python bench/processor_instructions.py [--mix guarded --mix dialects --mix budget]
       [--requests 40] [--time]   (a minute or so a mix)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import _callgrind as callgrind

HERE = Path(__file__).resolve().parent
MIX_NAMES = ("guarded", "dialects", "budget")
SECONDS_A_REQUEST = 0.002


def setup(mix: str, total: int, max_traces: int) -> tuple[Any, list[tuple[Any, bytes, int]]]:
    """A fresh detector, and ``total`` requests of the mix: (None, bytes, spans)."""
    import gc
    import random

    sys.path.insert(0, str(HERE))
    import _processor_traffic as traffic

    traffic.os.urandom = random.Random(8).randbytes  # type: ignore[attr-defined]  # repeatable ids
    from otel_guard_processor.bounds import DetectorLimits
    from otel_guard_processor.engine import EngineDetector

    template = traffic.MIXES[mix](40)
    requests = [(None, raw, spans) for raw, spans in (template.next() for _ in range(total))]
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    return EngineDetector(DetectorLimits(max_traces=max_traces)), requests


def ingest(detector: Any, requests: list[tuple[Any, bytes, int]], first: int, count: int) -> None:
    """Ingest ``count`` requests from ``first`` on, at 2 ms a request, sweeping every second."""
    from otel_guard_processor.engine import decode_counts

    for index in range(first, first + count):
        _, raw, _ = requests[index]
        now = index * SECONDS_A_REQUEST
        decode_counts(raw, ())  # the service's check before it acknowledges
        detector.ingest(raw, now)
        if int(now + SECONDS_A_REQUEST) > int(now):
            detector.expire(now + SECONDS_A_REQUEST)


def child(mix: str, count: int, args: argparse.Namespace) -> None:
    """Warm up, then ingest ``count`` requests, after a setup that is the same whatever the count."""
    detector, requests = setup(mix, args.warm + args.requests, args.max_traces)
    ingest(detector, requests, 0, args.warm)
    ingest(detector, requests, args.warm, count)


def instructions(mix: str, count: int, args: argparse.Namespace) -> int:
    arguments = ["--child", mix, "--count", str(count), "--requests", str(args.requests), "--warm",
                 str(args.warm), "--max-traces", str(args.max_traces)]  # fmt: skip
    return callgrind.instructions(__file__, arguments, 1800)


def nanoseconds(mix: str, args: argparse.Namespace) -> float:
    """The same work timed in this process: the best of ``--repeat`` runs, in ns a span."""
    best = float("inf")
    for _ in range(args.repeat):
        detector, requests = setup(mix, args.warm + args.requests, args.max_traces)
        ingest(detector, requests, 0, args.warm)
        started = time.perf_counter()
        ingest(detector, requests, args.warm, args.requests)
        best = min(best, time.perf_counter() - started)
    return best / sum(spans for _, _, spans in requests[args.warm :]) * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=40, help="requests measured (40 traces each)")
    parser.add_argument("--warm", type=int, default=60, help="requests ingested before, in both runs")
    parser.add_argument("--max-traces", type=int, default=2000, help="the detector's max_traces")
    parser.add_argument("--mix", action="append", choices=MIX_NAMES)
    parser.add_argument("--time", action="store_true", help="also time the same work natively")
    parser.add_argument("--repeat", type=int, default=9, help="native runs, the best of them shown")
    parser.add_argument("--child", choices=MIX_NAMES, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.count, args)
        return
    callgrind.require_valgrind()
    for mix in args.mix or MIX_NAMES:
        base = instructions(mix, 0, args)
        total = instructions(mix, args.requests, args)
        _, requests = setup(mix, args.warm + args.requests, args.max_traces)
        spans = sum(count for _, _, count in requests[args.warm :])
        timed = f"   {nanoseconds(mix, args):6,.0f} ns a span (best of {args.repeat})" if args.time else ""
        print(
            f"{mix:9s} {(total - base) / spans:8,.0f} instructions a span ({spans:,} spans){timed}",
            flush=True,
        )


if __name__ == "__main__":
    main()
