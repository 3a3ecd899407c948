"""A process in a delegation tree that spends its budget: extract the carrier, make sibling hops.

Configured only by the environment (``OTEL_GUARD_*``). Reads on stdin::

    {"carrier": {...}, "prefix": "worker", "hops": 20, "start_at": <unix time to begin>}

waits until ``start_at`` (so that processes start spending together), then makes ``hops`` hops
one after another, each a child of the extracted context, and prints on stdout::

    {"allowed": N, "refused": {"budget": M, ...}, "hop_counts": [the otel_guard.budget.hops seen]}
"""

from __future__ import annotations

import json
import sys
import time

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider

import otel_guard


def main() -> None:
    request = json.load(sys.stdin)
    trace.set_tracer_provider(TracerProvider())
    token = context.attach(propagate.extract(request["carrier"]))
    allowed = 0
    refused: dict[str, int] = {}
    counts: list[int] = []
    time.sleep(max(0.0, request.get("start_at", 0) - time.time()))
    try:
        for index in range(request["hops"]):
            try:
                with otel_guard.delegate(f"{request['prefix']}{index}") as hop:
                    allowed += 1
                    counts.append(int((hop.span.attributes or {}).get("otel_guard.budget.hops", -1)))  # type: ignore[attr-defined]
            except otel_guard.DelegationRefused as err:
                refused[err.reason] = refused.get(err.reason, 0) + 1
    finally:
        context.detach(token)
    print(json.dumps({"allowed": allowed, "refused": refused, "hop_counts": counts}))


if __name__ == "__main__":
    main()
