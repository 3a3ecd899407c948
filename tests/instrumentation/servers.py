"""A test program run the way a user runs it: under ``opentelemetry-instrument``, on 127.0.0.1.

``start_instrumented`` launches a program with its stdout and stderr in files; the program writes
the port it listens on (a free one it picked) to its ``--port-file`` once it serves, and the console
span exporter prints its spans on stdout. ``wait_until_serving`` waits for every program's port file
(failing with the program's stderr if it exits or takes too long); ``InstrumentedProgram.stop``
terminates the program by its own process, then kills it if it does not exit.

A test that starts a program stops it in a ``finally`` (or a fixture's teardown).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

STOP_SECONDS = 20.0
SPAN_SECONDS = 30.0
"""How long a program may take to export the spans of a call it has answered."""


def user_environment(keys: str, **settings: str) -> dict[str, str]:
    """This process's environment without its OpenTelemetry variables, configured the way a user
    would: spans to the console exporter (flushed every 100 ms), the agent cycle rule, ``keys``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="100",
        OTEL_GUARD_CYCLE_RULE="agent",
        OTEL_GUARD_KEYS=keys,
        PYTHONUNBUFFERED="1",
    )
    env.update(settings)
    return env


@dataclass
class InstrumentedProgram:
    """One program under ``opentelemetry-instrument``; its output in files."""

    name: str
    port_file: Path
    stdout: Path
    stderr: Path
    process: subprocess.Popen[bytes]
    env: dict[str, str]

    @property
    def port(self) -> str:
        return self.port_file.read_text().strip()

    def spans(self) -> list[dict[str, Any]]:
        """The spans the console exporter has printed so far (concatenated JSON objects)."""
        text = self.stdout.read_text()
        decoder = json.JSONDecoder()
        found: list[dict[str, Any]] = []
        position = 0
        while (start := text.find("{", position)) >= 0:
            try:
                span, position = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                break  # the exporter is part-way through writing this one
            found.append(span)
        return found

    def wait_for_spans(
        self, name: str, count: int, *, within: float = SPAN_SECONDS, **attributes: Any
    ) -> list[dict[str, Any]]:
        """The spans ``name`` with these attribute values, once ``count`` of them were exported (or
        what there is after ``within`` seconds)."""
        deadline = time.monotonic() + within
        while True:
            found = [
                span
                for span in self.spans()
                if span["name"] == name and all(span["attributes"].get(k) == v for k, v in attributes.items())
            ]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def stderr_lines(self, prefix: str) -> list[str]:
        """What follows ``prefix`` on each stderr line that starts with it."""
        return [
            line[len(prefix) :] for line in self.stderr.read_text().splitlines() if line.startswith(prefix)
        ]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


ProgramT = TypeVar("ProgramT", bound=InstrumentedProgram)


def start_instrumented(
    name: str,
    program: Path,
    folder: Path,
    env: dict[str, str],
    *args: str | Path,
    kind: type[ProgramT] = InstrumentedProgram,  # type: ignore[assignment]
) -> ProgramT:
    """``program --port-file FOLDER/NAME.port *args`` under ``opentelemetry-instrument``, as a
    ``kind`` (a subclass adds what a test reads from that program's output)."""
    port_file, stdout, stderr = (folder / f"{name}.{kind}" for kind in ("port", "out", "err"))
    instrument = Path(sys.executable).with_name("opentelemetry-instrument")
    command = [instrument, sys.executable, program, "--port-file", port_file, *args]
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [str(part) for part in command], env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL
        )
    return kind(name, port_file, stdout, stderr, process, env)


def wait_until_serving(programs: Iterable[InstrumentedProgram], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for program in programs:
        while not program.port_file.exists():
            assert program.process.poll() is None, f"{program.name} exited:\n{program.stderr.read_text()}"
            assert time.monotonic() < deadline, f"{program.name} did not start:\n{program.stderr.read_text()}"
            time.sleep(0.05)
