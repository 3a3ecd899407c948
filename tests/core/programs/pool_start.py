"""Work handed to a forked ``multiprocessing.Pool`` from a hop, in a fresh interpreter.

Reads ``{"start": [...]}`` on stdin: what the program does before the hop, in order, each of
``configure`` (the guard configured directly) and ``threading_instrumentor`` (OpenTelemetry's own
ThreadingInstrumentor instrumented; its package must be installed). The pool is made first, outside
any hop. Prints JSON on stdout: the wrappers (by module) of ``Pool.__init__``, ``Pool.apply_async``
and ``ProcessPoolExecutor.submit`` right after ``import otel_guard``, after those steps and after the
hop, and ``carried``: whether the work saw the hop's chain.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.pool
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import otel_guard
from otel_guard import current_chain, delegate


def wrappers(obj: Any) -> list[str]:
    """The modules of the wrappers (wrapt's) around ``obj``'s original function, outermost first."""
    found = []
    while hasattr(obj, "__wrapped__"):
        found.append(obj._self_wrapper.__module__)
        obj = obj.__wrapped__
    return found


def patched() -> dict[str, list[str]]:
    pool = vars(multiprocessing.pool.Pool)
    return {
        "init": wrappers(pool["__init__"]),
        "apply_async": wrappers(pool["apply_async"]),
        "submit": wrappers(vars(ProcessPoolExecutor)["submit"]),
    }


def root_here() -> str | None:
    chain = current_chain()
    return chain.root if chain is not None else None


def main() -> None:
    steps = (json.load(sys.stdin) or {}).get("start", [])
    after_import = patched()
    pool = multiprocessing.get_context("fork").Pool(1)
    for step in steps:
        if step == "configure":
            otel_guard.configure()
        elif step == "threading_instrumentor":
            from opentelemetry.instrumentation.threading import ThreadingInstrumentor

            ThreadingInstrumentor().instrument()
        else:
            raise SystemExit(f"unknown step {step!r}")
    before_hop = patched()
    with delegate("planner") as hop:
        seen = pool.apply_async(root_here).get(30)
    pool.terminate()
    pool.join()
    assert hop.chain is not None
    print(
        json.dumps(
            {
                "after_import": after_import,
                "before_hop": before_hop,
                "after_hop": patched(),
                "carried": seen == hop.chain.root,
            }
        )
    )


if __name__ == "__main__":
    main()
