"""What reading a request costs a span: the engine's walker against upb, side by side in one run.

On the same requests (``bench/_processor_traffic.py``'s mixes, ~40 traces a request, new ids each
cycle), the best and the median of ``--rounds`` rounds, each reading every request ``--loops``
times with each of:

- ``walker``: ``_engine.decode_counts``: the request decoded once (ids, parent, name, kind, scope,
  links, the asked-for attributes), nothing handed back but three counts;
- ``walker+py``: ``_engine.decode_summary``: the same, every span handed back as Python tuples (what
  the service will not do: it is here to show what one object a span costs);
- ``upb``: ``ExportTraceServiceRequest.FromString`` alone;
- ``upb+py``: that parse, then the same fields read in Python.

The keys asked for are the attributes the dialects and the guard's spans are read by. Run from a
checkout whose engine is built (``pip install -e ./processor``, a release build).

Usage: python bench/engine_decode.py [--mix guarded --mix dialects --mix budget] [--traces 40]
       [--rounds 15] [--loops 20] [--save DIR]

``--save DIR`` also writes the requests (``DIR/<mix>-<n>.bin``) for the decoder's native bench
(``cargo run --release --example decode_bench -- DIR/*.bin`` in processor/).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _processor_traffic as traffic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otel_guard_processor import engine

KEYS = [
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.tool.name",
    "gen_ai.workflow.name",
    "gen_ai.caller.agent.name",
    "openinference.span.kind",
    "agent.name",
    "graph.node.id",
    "tool.name",
    "traceloop.span.kind",
    "traceloop.entity.name",
    "otel_guard.chain.agents",
    "otel_guard.chain.root",
    "otel_guard.chain.depth",
    "otel_guard.name_depth",
    "otel_guard.decision",
    "otel_guard.reason",
    "otel_guard.mode",
    "otel_guard.budget.hops",
]
WANTED = frozenset(KEYS)


def upb(raw: bytes) -> object:
    return ExportTraceServiceRequest.FromString(raw)


def upb_and_python(raw: bytes) -> object:
    request = ExportTraceServiceRequest.FromString(raw)
    kept = []
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                links = [(link.trace_id, link.span_id) for link in span.links]
                attributes = []
                for key_value in span.attributes:
                    if key_value.key in WANTED:
                        value = key_value.value
                        case = value.WhichOneof("value")
                        if case == "array_value":
                            attributes.append(
                                (key_value.key, [item.string_value for item in value.array_value.values])
                            )
                        elif case is not None:
                            attributes.append((key_value.key, getattr(value, case)))
                kept.append(
                    (
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        span.kind,
                        scope,
                        links,
                        attributes,
                    )
                )
    return kept


READERS: dict[str, Callable[[bytes], object]] = {
    "walker": lambda raw: engine.decode_counts(raw, KEYS),
    "walker+py": lambda raw: engine.decode_summary(raw, KEYS),
    "upb": upb,
    "upb+py": upb_and_python,
}


def measure(mix: str, args: argparse.Namespace) -> None:
    template = traffic.MIXES[mix](args.traces)
    requests = [template.next() for _ in range(2 * len(template.raws))]
    raws = [raw for raw, _ in requests]
    spans = sum(count for _, count in requests) * args.loops
    size = sum(len(raw) for raw in raws) / sum(count for _, count in requests)
    for index, (raw, count) in enumerate(requests):  # the walker and upb see the same spans
        assert engine.decode_counts(raw, KEYS)[0] == count
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"{mix}-{index}.bin").write_bytes(raw)
    times: dict[str, list[float]] = {name: [] for name in READERS}
    for _ in range(args.rounds):
        for name, read in READERS.items():  # side by side, round after round
            start = time.perf_counter_ns()
            for _ in range(args.loops):
                for raw in raws:
                    read(raw)
            times[name].append((time.perf_counter_ns() - start) / spans / 1000)
    cells = []
    for name in READERS:
        cells.append(f"{name} {min(times[name]):.2f} / {statistics.median(times[name]):.2f}")
    walker = statistics.median(times["walker"])
    print(
        f"{mix:9} {size:6.0f} B a span, {requests[0][1]:4} spans a request | µs a span, min / median: "
        + " | ".join(cells)
        + f" | upb ÷ walker {statistics.median(times['upb']) / walker:.1f}×"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mix", action="append", choices=sorted(traffic.MIXES))
    parser.add_argument("--traces", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--save", type=Path, metavar="DIR")
    args = parser.parse_args()
    for mix in args.mix or ["guarded", "dialects", "budget"]:
        measure(mix, args)


if __name__ == "__main__":
    main()
