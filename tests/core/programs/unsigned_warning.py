"""Hops in a fresh interpreter with the keys the environment gives (maybe none).

Reads ``{"threads": N}`` on stdin (or ``null`` for one thread): N threads start their first hop at the
same moment, three hops each. Logging is left unconfigured, so a warning reaches stderr through
Python's last-resort handler. Prints the decisions as JSON on stdout.
"""

from __future__ import annotations

import json
import sys
import threading

import otel_guard


def main() -> None:
    options = json.load(sys.stdin) or {}
    threads = int(options.get("threads", 1))
    start = threading.Barrier(threads, timeout=30)
    decisions: list[str] = []
    lock = threading.Lock()

    def hops() -> None:
        start.wait()
        for agent in ("planner", "budget", "weather"):
            with otel_guard.delegate(agent) as hop, lock:
                decisions.append(str(hop.decision))

    workers = [threading.Thread(target=hops) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    print(json.dumps(sorted(decisions)))


if __name__ == "__main__":
    main()
