"""What counting one model response costs the guard, in instructions (callgrind, as
``inline_instructions.py`` counts a hop): ``after_model_request`` in a guarded hop, memory store.

The arms (the SDK of ``inline_overhead.py``: a MeterProvider with a reader, so a counter's ``add`` is
the SDK's real one):

* ``tokens``: ``max_tokens`` on, a response's tokens added to its tree;
* ``cost``: ``max_cost`` on as well, the response priced from a prices entry (and, since
  ``otel_guard.budget.spend``, counted in that counter);
* ``unpriced``: ``max_cost`` on, a response no price covers (``otel_guard.budget.unpriced``).

Run it with the code before and after a change (``PYTHONPATH``) to see what the change costs a
response; ``cost / tokens`` is what pricing costs over counting tokens alone.

Usage: python bench/model_request_instructions.py [--count 2000] [--arm NAME ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _callgrind as callgrind

HERE = Path(__file__).resolve().parent
ARMS = ("tokens", "cost", "unpriced")
MODEL = "bench-model"


def child(arm: str, count: int) -> None:
    """Run ``arm`` ``count`` times after a setup that is the same whatever the count."""
    sys.path.insert(0, str(HERE))
    import inline_overhead as bench

    import otel_guard
    from otel_guard._pricing import ModelUsage
    from otel_guard.usage import after_model_request

    bench.setup(counting=True)
    prices = {MODEL: {"input": "2.5", "output": 10}}
    if arm == "tokens":
        otel_guard.configure(max_tokens=10**12)
    else:
        otel_guard.configure(max_tokens=10**12, max_cost=10**9, prices=prices)
    usage = ModelUsage(MODEL if arm != "unpriced" else "homegrown", 1_200, 300)
    with otel_guard.delegate("planner", "plan"):
        after_model_request(usage)  # the first: the meters, the series and the warning made
        for _ in range(count):
            after_model_request(usage)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--arm", action="append", choices=ARMS)
    parser.add_argument("--child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.count)
        return
    callgrind.require_valgrind()
    per: dict[str, float] = {}
    for arm in args.arm or ARMS:
        base = callgrind.instructions(__file__, ["--child", arm, "--count", "0"], 900)
        total = callgrind.instructions(__file__, ["--child", arm, "--count", str(args.count)], 900)
        per[arm] = (total - base) / args.count
        print(f"{arm:9s} {per[arm] / 1000:8.1f} k instructions a response", flush=True)
    if "cost" in per and "tokens" in per:
        print(f"cost / tokens: {per['cost'] / per['tokens']:.2f}")


if __name__ == "__main__":
    main()
