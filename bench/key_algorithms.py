"""What a hop's token costs with per-service keys (EdDSA, ES256) next to a shared secret (HS256).

Three arms per algorithm, run side by side in one process (rounds interleaved, the algorithms'
order turned each round, the median round kept), each on tokens no cache has seen:

* ``verify``: ``otel_guard.chain.decode`` of a fresh token (what a server does once per request);
* ``sign``: ``encode`` of a fresh chain (what a hop that calls out does once);
* ``hop``: a server's guarded hop of a fresh token (``delegate(..., receiving=True)`` under an SDK
  tracer provider with no exporter): verify, decide, span.

Prints microseconds per operation and each algorithm's ratio to HS256's. The primitives are the
``cryptography`` package's (OpenSSL).

Usage: python bench/key_algorithms.py [--count 300] [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider

import otel_guard
from otel_guard.chain import Chain, Hop, Keyring, decode, encode, generate_key, generate_key_pair, new_root

ALGS = ("HS256", "EdDSA", "ES256")


def keyring(alg: str) -> Keyring:
    if alg == "HS256":
        kid, secret = generate_key("bench")
        return Keyring.parse(f"{kid}:{secret}")
    kid, private, _ = generate_key_pair(alg, "bench")
    return Keyring.parse(f"{kid}:{private}")


def chains(count: int) -> list[Chain]:
    now = time.time()
    hops = (Hop("planner", "plan"), Hop("budget", "price"))
    return [Chain(hops, new_root(), "default", now, now + 300) for _ in range(count)]


def per_op(run: Callable[[], None], count: int) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) / count * 1e6


def arms(alg: str, keys: Keyring, count: int) -> dict[str, Callable[[], float]]:
    def verify() -> float:
        tokens = [encode(chain, keys) for chain in chains(count)]
        return per_op(lambda: [decode(token, keys) for token in tokens] and None, count)

    def sign() -> float:
        fresh = chains(count)
        return per_op(lambda: [encode(chain, keys) for chain in fresh] and None, count)

    def hop() -> float:
        otel_guard.configure(keys=keys, max_hops=0)
        tokens = [encode(chain, keys) for chain in chains(count)]
        contexts = [baggage.set_baggage("otel_guard.chain", token) for token in tokens]

        def run() -> None:
            for ctx in contexts:
                attached = context.attach(ctx)
                try:
                    with otel_guard.delegate("budget", "price", receiving=True):
                        pass
                finally:
                    context.detach(attached)

        return per_op(run, count)

    return {"verify": verify, "sign": sign, "hop": hop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="operations per arm per round")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    trace.set_tracer_provider(TracerProvider())
    keys = {alg: keyring(alg) for alg in ALGS}
    samples: dict[tuple[str, str], list[float]] = {}
    for round_number in range(args.rounds):
        order = ALGS[round_number % 3 :] + ALGS[: round_number % 3]
        for alg in order:
            for arm, measure in arms(alg, keys[alg], args.count).items():
                samples.setdefault((arm, alg), []).append(measure())
    print(f"µs per operation (median of {args.rounds} rounds of {args.count}), ratio to HS256")
    print(f"{'arm':8} " + "  ".join(f"{alg:>16}" for alg in ALGS))
    for arm in ("verify", "sign", "hop"):
        base = statistics.median(samples[(arm, "HS256")])
        cells = []
        for alg in ALGS:
            value = statistics.median(samples[(arm, alg)])
            cells.append(f"{value:8.1f} ({value / base:5.2f}x)")
        print(f"{arm:8} " + "  ".join(cells))


if __name__ == "__main__":
    main()
