"""What detection costs a span in the compiled engine, as the service runs it, side by side in one run.

On the same requests (``bench/_processor_traffic.py``'s mixes, ``--traces`` traces a request, new
trace ids each cycle of the template), time advancing a millisecond a request and a sweep
(``expire``) every thousand requests, as the service's clock and sweeper would: ``--warmup``
requests first, untimed, to fill the state to its bounds (50,000 traces held, the oldest evicted
as new ones come, as under load), then ``--requests`` timed; the best and the median of
``--rounds`` rounds, µs of CPU a span, with each of:

- ``engine``: :class:`~otel_guard_processor.engine.EngineDetector` -- ``Engine.ingest(raw, now)``
  (decode, dialects, one-call rules, graph, all in Rust) and its events tallied in Python;
- ``service``: what the service does with each request: the check before it is acknowledged
  (``decode_counts(raw, ())``: a readable request, and its spans) and then the engine's ingest;
- ``engine+file`` (with ``--dialects FILE``): ``engine`` reading calls by the built-in table and
  then by a dialects file's rows (their attribute keys kept besides the built-in ones).

(The pure-Python detector this once compared with is gone: 1.9 µs a span on ``guarded`` and
4.5 on ``dialects``, natively, when it went.) Run from a checkout whose engine is built
(``pip install -e ./processor``: a release build).

Usage: python bench/engine_ingest.py [--mix guarded --mix dialects --mix budget] [--traces 40]
       [--rounds 5] [--warmup 1500] [--requests 1000] [--save DIR] [--dialects FILE]

``--save DIR`` also writes the warm-up's and the timed requests (``DIR/<mix>-<n>.bin``, in order)
for the engine's native bench (``cargo run --release --example ingest_bench -- DIR/<mix>-*.bin``
in processor/, which times the requests after the first WARMUP=1500 likewise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _processor_traffic as traffic
from otel_guard_processor.dialects_file import Spec
from otel_guard_processor.engine import EngineDetector, decode_counts, dialect_table

SWEEP_EVERY = 1000
TICK = 0.001  # seconds a request


def run_engine(
    warmup: Iterator[bytes], raws: list[bytes], check: bool = False, dialects: tuple[Spec, ...] = ()
) -> float:
    detector = EngineDetector(dialects=dialects)
    index = 0
    for raw in warmup:
        detector.ingest(raw, index * TICK)
        index += 1
    start = time.process_time_ns()
    for raw in raws:
        now = index * TICK
        if check:
            decode_counts(raw, ())
        detector.ingest(raw, now)
        if index % SWEEP_EVERY == SWEEP_EVERY - 1:
            detector.expire(now)
        index += 1
    return time.process_time_ns() - start


def fresh(template: traffic.Template, count: int) -> Iterator[bytes]:
    """``count`` requests of ``template``, made as they are read (their ids new to whoever reads)."""
    for _ in range(count):
        yield template.next()[0]


def measure(mix: str, args: argparse.Namespace) -> None:
    template = traffic.MIXES[mix](args.traces)
    requests = [template.next() for _ in range(args.requests)]
    raws = [raw for raw, _ in requests]
    spans = sum(count for _, count in requests)
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        for index, raw in enumerate([*fresh(template, args.warmup), *raws]):
            (args.save / f"{mix}-{index:05d}.bin").write_bytes(raw)
    warmup = args.warmup
    runs: dict[str, Callable[[], float]] = {
        "engine": lambda: run_engine(fresh(template, warmup), raws),
        "service": lambda: run_engine(fresh(template, warmup), raws, check=True),
    }
    if args.dialects is not None:
        from otel_guard_processor.dialects_file import read_dialects

        rows = read_dialects(args.dialects, dialect_table()[0])
        runs["engine+file"] = lambda: run_engine(fresh(template, warmup), raws, dialects=rows)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():  # side by side, round after round
            times[name].append(run() / spans / 1000)
    cells = [f"{name} {min(times[name]):.2f} / {statistics.median(times[name]):.2f}" for name in runs]
    print(f"{mix:9} {requests[0][1]:4} spans a request | µs a span, min / median: " + " | ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mix", action="append", choices=sorted(traffic.MIXES))
    parser.add_argument("--traces", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=1500)
    parser.add_argument("--save", type=Path, metavar="DIR")
    parser.add_argument("--dialects", type=Path, metavar="FILE", help="a dialects file for engine+file")
    args = parser.parse_args()
    for mix in args.mix or ["guarded", "dialects", "budget"]:
        measure(mix, args)


if __name__ == "__main__":
    main()
