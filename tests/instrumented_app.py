"""Running a program the way a user runs it: ``opentelemetry-instrument python app.py``, configured by
the environment alone, with the spans on the console.

The program has no otel-guard code in it; the ``opentelemetry_instrumentor`` entry points install the
guard. It prints one ``RESULT {json}`` line of what it saw; everything else it prints is the console
exporter's spans. Shared by every runtime's subprocess test, in every test environment (this folder is
on the path of every test run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_instrumented(
    app: Path, *args: str, service: str, timeout: float = 90, **guard_env: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``app`` under this environment's ``opentelemetry-instrument``, with the test's own
    ``OTEL_*`` settings and ``PYTHONPATH`` taken out and ``guard_env`` added; its RESULT and the spans
    it exported. A failing exit or a traceback on stderr fails the test with the program's stderr."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "PYTHONPATH"))}
    env |= {
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        **guard_env,
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("opentelemetry-instrument")), sys.executable, str(app), *args],
        env=env,
        cwd=app.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    result: dict[str, Any] | None = None
    exported = []
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
        else:
            exported.append(line)
    assert result is not None, done.stdout + done.stderr
    return result, console_spans("\n".join(exported))


def console_spans(text: str) -> list[dict[str, Any]]:
    """The console exporter writes one indented JSON object per span, back to back."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    position = 0
    while (start := text.find("{", position)) != -1:
        span, position = decoder.raw_decode(text, start)
        found.append(span)
    return found


def hops(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The guard's spans among ``spans``."""
    return [s for s in spans if "otel_guard.decision" in s["attributes"]]


# The chain of the refused hop when planner's tool ``ask_budget`` runs budget, whose ``ask_planner``
# runs planner again: the first bounce, refused.
THROUGH_TOOLS = ("planner", "ask_budget", "budget", "ask_planner", "planner")


def assert_planner_refused(spans: list[dict[str, Any]], chain: tuple[str, ...] = THROUGH_TOOLS) -> None:
    """One hop among ``spans`` was refused: planner's re-entry, for a cycle, with its event and
    ``chain`` as its chain."""
    refused = [s for s in hops(spans) if s["attributes"]["otel_guard.decision"] == "refuse"]
    assert len(refused) == 1, [(s["name"], s["attributes"]["otel_guard.decision"]) for s in hops(spans)]
    (hop,) = refused
    assert hop["name"] == "invoke_agent planner"
    assert hop["attributes"]["otel_guard.reason"] == "cycle"
    assert hop["attributes"]["otel_guard.chain.agents"] == list(chain)
    assert [e["name"] for e in hop["events"]] == ["otel_guard.refused"]


def assert_observe_mode_let_it_through(spans: list[dict[str, Any]]) -> None:
    """Observe mode (set in the environment) recorded would-refuse hops, each with its event, and
    refused none."""
    would = [s for s in hops(spans) if s["attributes"]["otel_guard.decision"] == "would_refuse"]
    assert would
    assert {s["attributes"]["otel_guard.mode"] for s in hops(spans)} == {"observe"}
    assert all([e["name"] for e in s["events"]] == ["otel_guard.would_refuse"] for s in would)
