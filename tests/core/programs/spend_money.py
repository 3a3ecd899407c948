"""A process of a delegation tree that spends the tree's money: model requests until one is refused.

Configured only by the environment (``OTEL_GUARD_*``: the Redis store, ``max_cost``, ``prices``).
Reads one line on stdin::

    {"carrier": {...}, "agent": "worker1", "requests": 40, "model": "acme-large",
     "input_tokens": 1000, "output_tokens": 100, "in_flight": <seconds a response takes>}

continues the tree in the carrier with one hop into ``agent``, prints ``ready``, and waits for a
second line (``go``: so that processes start spending together, however long each took to start);
then makes up to ``requests`` model requests one after another, as a runtime's instrumentor does:
checked before, the response's usage added after ``in_flight`` seconds. Prints on stdout::

    {"made": N, "refused": "<the refusal, or null>"}
"""

from __future__ import annotations

import json
import sys
import time

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider

import otel_guard
from otel_guard.usage import ModelUsage, after_model_request, before_model_request


def main() -> None:
    request = json.loads(sys.stdin.readline())
    trace.set_tracer_provider(TracerProvider())
    token = context.attach(propagate.extract(request["carrier"]))
    usage = ModelUsage(request["model"], request["input_tokens"], request["output_tokens"])
    made, refused = 0, None
    try:
        with otel_guard.delegate(request["agent"]):
            print("ready", flush=True)
            sys.stdin.readline()
            for _ in range(request["requests"]):
                refused = before_model_request()
                if refused is not None:
                    break
                made += 1
                time.sleep(request["in_flight"])
                after_model_request(usage)
    finally:
        context.detach(token)
    print(json.dumps({"made": made, "refused": refused}))


if __name__ == "__main__":
    main()
