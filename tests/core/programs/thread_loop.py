"""The planner → budget → planner loop, budget run in a pool thread, in a fresh interpreter.

Reads ``{"start": [...]}`` on stdin: what the program does before the loop, in order, each of
``configure`` (the guard configured directly), ``instrument`` (every otel-guard instrumentor
instrumented, as ``opentelemetry-instrument`` does), ``uninstrument`` (every one uninstrumented) and
``threading_instrumentor`` / ``threading_uninstrument`` (OpenTelemetry's own ThreadingInstrumentor
instrumented / uninstrumented). Prints JSON on stdout: the wrappers (by module) ``Thread.start`` and
``ThreadPoolExecutor.submit`` had right after ``import otel_guard``, after those steps and after the
loop, how often planner's body ran (5 when nothing stopped the loop) and the refusal's reason.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import entry_points
from typing import Any

import otel_guard
from otel_guard import DelegationRefused, agentic


def wrappers(obj: Any) -> list[str]:
    """The modules of the wrappers (wrapt's) around ``obj``'s original function, outermost first."""
    found = []
    while hasattr(obj, "__wrapped__"):
        found.append(obj._self_wrapper.__module__)
        obj = obj.__wrapped__
    return found


def patched() -> dict[str, list[str]]:
    return {
        "start": wrappers(threading.Thread.__dict__["start"]),
        "submit": wrappers(ThreadPoolExecutor.__dict__["submit"]),
    }


def main() -> None:
    steps = (json.load(sys.stdin) or {}).get("start", [])
    after_import = patched()
    ours = [
        ep.load()()
        for ep in entry_points(group="opentelemetry_instrumentor")
        if ep.value.startswith("otel_guard.")
    ]
    for step in steps:
        if step == "configure":
            otel_guard.configure(cycle_rule="agent")
        elif step == "instrument":
            for instrumentor in ours:
                instrumentor.instrument()
        elif step == "uninstrument":
            for instrumentor in ours:
                instrumentor.uninstrument()
        elif step in ("threading_instrumentor", "threading_uninstrument"):
            from opentelemetry.instrumentation.threading import ThreadingInstrumentor

            if step == "threading_instrumentor":
                ThreadingInstrumentor().instrument()
            else:
                ThreadingInstrumentor().uninstrument()
        else:
            raise SystemExit(f"unknown step {step!r}")
    before_loop = patched()

    runs: list[int] = []

    @agentic
    def planner() -> str:
        runs.append(1)
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(budget).result()

    @agentic
    def budget() -> str:
        # Where the chain does not cross threads, nothing stops the loop: it stops itself at 5 rounds.
        return "ran away" if len(runs) >= 5 else planner()

    reason = None
    try:
        planner()
    except DelegationRefused as exc:
        reason = exc.reason
    print(
        json.dumps(
            {
                "after_import": after_import,
                "before_loop": before_loop,
                "after_loop": patched(),
                "runs": len(runs),
                "refused": reason,
            }
        )
    )


if __name__ == "__main__":
    main()
