"""otel-guard and OpenTelemetry's ThreadingInstrumentor (which Strands turns on) side by side.

Both carry the context into threads. Whichever starts first, a loop through a pool thread is refused
once, the ThreadingInstrumentor's ``uninstrument`` takes off its own wrappers only, and otel-guard's
instrumentors' ``uninstrument`` never takes off the ThreadingInstrumentor's. Each case runs
``tests/core/programs/thread_loop.py`` in a fresh interpreter of this environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
PROGRAM = REPO / "tests" / "core" / "programs" / "thread_loop.py"
OURS = "otel_guard._threads"
THEIRS = "opentelemetry.instrumentation.threading"

pytestmark = pytest.mark.integration


def run(steps: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(REPO)
    completed = subprocess.run(
        [sys.executable, str(PROGRAM)],
        input=json.dumps({"start": steps}),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("steps", "wrappers"),
    [
        # Already carried when the guard starts: the guard adds no wrappers of its own.
        (["threading_instrumentor", "configure"], [THEIRS]),
        # Turned on after the guard: its wrappers go around the guard's.
        (["configure", "threading_instrumentor"], [THEIRS, OURS]),
        # Its uninstrument takes off its own wrappers; the guard's stay.
        (["configure", "threading_instrumentor", "threading_uninstrument"], [OURS]),
        # otel-guard's instrumentors, uninstrumented, leave the ThreadingInstrumentor's in place.
        (["threading_instrumentor", "instrument", "uninstrument"], [THEIRS]),
    ],
    ids=["it first", "guard first", "it uninstrumented", "guard uninstrumented"],
)
def test_a_loop_through_a_thread_is_refused_once_beside_the_threading_instrumentor(
    steps: list[str], wrappers: list[str]
) -> None:
    result = run(steps)

    assert result["after_loop"] == {"start": wrappers, "submit": wrappers}
    assert (result["runs"], result["refused"]) == (1, "cycle")
