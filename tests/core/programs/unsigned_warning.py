"""Three hops in a fresh interpreter with the keys the environment gives (maybe none).

Logging is left unconfigured, so a warning reaches stderr through Python's last-resort handler. Prints
the decisions as JSON on stdout.
"""

from __future__ import annotations

import json

import otel_guard


def main() -> None:
    decisions = []
    for agent in ("planner", "budget", "weather"):
        with otel_guard.delegate(agent) as hop:
            decisions.append(hop.decision)
    print(json.dumps(decisions))


if __name__ == "__main__":
    main()
