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
* budget: the nested hop with ``max_hops`` on against off (memory store); then, with
  ``redis-server`` installed, a PING round trip to a local Redis and the nested hop with the Redis
  store, each against the memory store's hop (the round trip is the Redis store's floor).
* ingress+extract: the same, with the headers (``traceparent``, ``baggage``) extracted through the
  global propagator in both arms: what a server pays in all for a request.

``bench/inline_instructions.py`` counts the instructions of the same arms (repeatable here).

Rounds alternate between the arms and the ratio is of the medians: this machine is noisy.
Usage: python bench/inline_overhead.py [--rounds 30] [--per-round 2000]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import socket
import statistics
import subprocess
import tempfile
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


def setup(counting: bool = False) -> trace.Tracer:
    """The SDK of both arms. ``counting`` (instruction children): the span processor's thread never
    wakes on its 5 s timer, only for a full batch, so that its count does not move with how slowly
    callgrind runs."""
    provider = TracerProvider()
    delay = 1e9 if counting else None  # None: the SDK default (5 s)
    provider.add_span_processor(
        BatchSpanProcessor(Discard(), max_queue_size=65536, schedule_delay_millis=delay)
    )
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    telemetry.bind(provider, meter_provider)
    # The tree budget off: the arms below repeat hops in one tree far past any budget.
    otel_guard.configure(keys={"bench": SECRET}, mode="enforce", max_depth=8, max_hops=0)
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
    labels: tuple[str, str] = ("bare span", "guarded hop"),
) -> float:
    time_round(bare, n, prepare), time_round(guarded, n, prepare)  # warm up
    bare_times: list[float] = []
    guard_times: list[float] = []
    for _ in range(rounds):
        bare_times.append(time_round(bare, n, prepare))
        guard_times.append(time_round(guarded, n, prepare))
    b, g = statistics.median(bare_times), statistics.median(guard_times)
    first, second = labels
    print(f"{name:16s} {first} {b * 1e6:6.1f} µs   {second} {g * 1e6:6.1f} µs   ratio {g / b:.2f}")
    return g / b


def measure_budgets(rounds: int, n: int) -> None:
    """The nested hop with the tree budget on against off (memory store), then with the Redis store
    beside one Redis round trip (``PING``) in the same run, when ``redis-server`` is installed."""

    def hops(count: int) -> None:
        with otel_guard.delegate("planner", "plan"), otel_guard.delegate("budget", "price"):
            for _ in range(count):
                with otel_guard.delegate("fx", "convert"):
                    pass

    def budget_off(count: int) -> None:
        otel_guard.configure(max_hops=0)
        hops(count)

    def budget_on(count: int) -> None:
        otel_guard.configure(max_hops=10**9)
        hops(count)

    measure("budget (memory)", budget_off, budget_on, rounds, n, labels=("hop, budget off", "hop, budget on"))
    binary = shutil.which("redis-server")
    if binary is None:
        print("budget (redis)   redis-server is not installed: skipped")
        otel_guard.configure(max_hops=0)
        return
    import redis

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        server = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", directory],
            stdout=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(host="127.0.0.1", port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            url = f"redis://127.0.0.1:{port}/0"
            few = max(n // 10, 50)

            def pings(count: int) -> None:
                for _ in range(count):
                    client.ping()

            script = client.register_script("return redis.call('INCR', KEYS[1])")

            def scripts(count: int) -> None:
                for _ in range(count):
                    script(keys=["bench:floor"], args=[])

            def redis_hops(count: int) -> None:
                otel_guard.configure(max_hops=10**9, budget_store=url)
                hops(count)

            def memory_hops(count: int) -> None:
                otel_guard.configure(max_hops=10**9, budget_store="memory")
                hops(count)

            measure("redis round trip", memory_hops, pings, rounds, few, labels=("memory hop", "PING"))
            measure("redis script", memory_hops, scripts, rounds, few, labels=("memory hop", "EVALSHA INCR"))
            measure(
                "budget (redis)", memory_hops, redis_hops, rounds, few, labels=("memory hop", "redis hop")
            )
        finally:
            server.kill()
            server.wait()
    otel_guard.configure(max_hops=0, budget_store="memory")


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

    measure_budgets(rounds, n)

    ratio_headers = measure(
        "ingress+extract", bare_from_headers, guarded_from_headers, rounds, n, prepare=mint_headers
    )
    print(
        f"goals: nested <= 1.15 ({ratio_nested:.2f}), ingress <= 1.5 ({ratio_ingress:.2f}); "
        f"with extraction in both arms {ratio_headers:.2f}"
    )


if __name__ == "__main__":
    main()
