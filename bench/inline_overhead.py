"""What a guarded hop costs next to a bare SDK span, measured side by side in one process.

Both arms run under the same SDK: a TracerProvider with a BatchSpanProcessor and an exporter that
discards, and a MeterProvider with a reader that is never collected during the run. The bare arm
opens a span with 5 attributes; the guarded arm is one ``delegate()`` hop (verify, decide, sign on
demand, span with the contract's attributes, decision tally, depth histogram).

* nested: the hop is the third of a chain made in this process (no verification needed). The bare
  span runs inside the same two hops, so both are children of the same parent: a root span costs
  the SDK less (no parent-based sampling), which would count against the guard. The ratio against a
  root span is printed as well.
* ingress: every hop arrives with a fresh token minted by PyJWT (another library), used once, so no
  cache can serve it: the guard verifies signature and claims every time. Both arms run inside the
  context a server's propagator would have extracted, so only the guard's own work differs.
* ingress+extract: the same, with the headers (``traceparent``, ``baggage``) extracted through the
  global propagator in both arms: what a server pays in all for a request.

``bench/inline_instructions.py`` counts the instructions of the same arms (repeatable here).

Rounds alternate between the arms and the ratio is of the medians: this machine is noisy.
Usage: python bench/inline_overhead.py [--rounds 30] [--per-round 2000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Sequence

import jwt
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import otel_guard
from otel_guard import telemetry
from otel_guard.chain import new_root

SECRET = b"b" * 32


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def setup() -> trace.Tracer:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=65536))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    telemetry.bind(provider, meter_provider)
    otel_guard.configure(keys={"bench": SECRET}, mode="enforce", max_depth=8)
    return provider.get_tracer("bench")


BARE_ATTRIBUTES = {
    "gen_ai.operation.name": "invoke_agent",
    "gen_ai.agent.name": "budget",
    "attr.three": 3,
    "attr.four": "four",
    "attr.five": True,
}


def pyjwt_tokens(count: int) -> list[str]:
    now = time.time()
    return [
        jwt.encode(
            {
                "v": 1,
                "root": new_root(),
                "ws": "default",
                "iat": now,
                "exp": now + 300,  # the lifetime every guard of the workspace gives a chain (its ttl)
                "hops": [["planner", "plan"], ["budget", "price"]],
            },
            SECRET,
            algorithm="HS256",
            headers={"kid": "bench"},
        )
        for _ in range(count)
    ]


def time_round(fn: Callable[[int], None], n: int, prepare: Callable[[int], None] | None) -> float:
    if prepare is not None:
        prepare(n)  # untimed: e.g. mint this round's tokens
    gc.collect()
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n


def measure(
    name: str,
    bare: Callable[[int], None],
    guarded: Callable[[int], None],
    rounds: int,
    n: int,
    prepare: Callable[[int], None] | None = None,
) -> float:
    time_round(bare, n, prepare), time_round(guarded, n, prepare)  # warm up
    bare_times: list[float] = []
    guard_times: list[float] = []
    for _ in range(rounds):
        bare_times.append(time_round(bare, n, prepare))
        guard_times.append(time_round(guarded, n, prepare))
    b, g = statistics.median(bare_times), statistics.median(guard_times)
    print(f"{name:16s} bare span {b * 1e6:6.1f} µs   guarded hop {g * 1e6:6.1f} µs   ratio {g / b:.2f}")
    return g / b


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=2000)
    args = parser.parse_args()
    tracer = setup()
    rounds, n = args.rounds, args.per_round

    def bare(count: int) -> None:
        for _ in range(count):
            with tracer.start_as_current_span("invoke_agent budget", attributes=BARE_ATTRIBUTES):
                pass

    def bare_nested(count: int) -> None:
        with otel_guard.delegate("planner", "plan"), otel_guard.delegate("budget", "price"):
            bare(count)

    def nested(count: int) -> None:
        with otel_guard.delegate("planner", "plan"), otel_guard.delegate("budget", "price"):
            for _ in range(count):
                with otel_guard.delegate("fx", "convert"):
                    pass

    ratio_nested = measure("nested", bare_nested, nested, rounds, n)
    measure("(vs a root span)", bare, nested, rounds, n)

    # Each round gets tokens minted just before it (untimed), each used once, so neither a cache
    # nor a huge pre-made list (whose memory traffic would slow both arms) distorts the figures.
    contexts: list[context.Context] = []

    def mint(count: int) -> None:
        contexts[:] = [baggage.set_baggage("otel_guard.chain", t) for t in pyjwt_tokens(count)]

    def take(count: int) -> list[context.Context]:
        return contexts[:count]

    def bare_ingress(count: int) -> None:
        for ctx in take(count):
            token = context.attach(ctx)
            with tracer.start_as_current_span("invoke_agent fx", attributes=BARE_ATTRIBUTES):
                pass
            context.detach(token)

    def guarded_ingress(count: int) -> None:
        for ctx in take(count):
            token = context.attach(ctx)
            with otel_guard.delegate("fx", "convert"):
                pass
            context.detach(token)

    ratio_ingress = measure("ingress", bare_ingress, guarded_ingress, rounds, n, prepare=mint)

    # What a server pays in all: the headers extracted (traceparent and baggage, the global
    # propagator), then a bare span or the guarded hop.
    carriers: list[dict[str, str]] = []
    remote = trace.NonRecordingSpan(
        trace.SpanContext(0x1F, 0x2F, is_remote=True, trace_flags=trace.TraceFlags(1))
    )

    def mint_headers(count: int) -> None:
        carriers[:] = []
        for text in pyjwt_tokens(count):
            carrier: dict[str, str] = {}
            ctx = baggage.set_baggage("otel_guard.chain", text, trace.set_span_in_context(remote))
            propagate.inject(carrier, ctx)
            carriers.append(carrier)

    def bare_from_headers(count: int) -> None:
        for carrier in carriers[:count]:
            token = context.attach(propagate.extract(carrier))
            with tracer.start_as_current_span("invoke_agent fx", attributes=BARE_ATTRIBUTES):
                pass
            context.detach(token)

    def guarded_from_headers(count: int) -> None:
        for carrier in carriers[:count]:
            token = context.attach(propagate.extract(carrier))
            with otel_guard.delegate("fx", "convert"):
                pass
            context.detach(token)

    ratio_headers = measure(
        "ingress+extract", bare_from_headers, guarded_from_headers, rounds, n, prepare=mint_headers
    )
    print(
        f"goals: nested <= 1.15 ({ratio_nested:.2f}), ingress <= 1.5 ({ratio_ingress:.2f}); "
        f"with extraction in both arms {ratio_headers:.2f}"
    )


if __name__ == "__main__":
    main()
