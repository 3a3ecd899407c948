"""Counting what a benchmark's child process executes, in instructions, under valgrind's callgrind.

Instruction counts do not depend on what else a shared machine is doing: the same run gives the
same figure within a fraction of a per cent, where times move with the load. Every child runs with a
fixed hash seed (``PYTHONHASHSEED=0`` unless the environment given sets one): the same dict and set
layouts, and so the same garbage collections, in every child (without it, a CrewAI run's count moved
by tens of millions of instructions from one child to the next), and no thread pool of a numerical
library (:data:`QUIET`). :func:`counted_between` counts only what runs between two :func:`mark` calls
of the child: what a child does before and after them (imports, warm-up, interpreter exit) moves by
a few million instructions from child to child with the allocator's layout, the same work or not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

COLLECTED = re.compile(r"Collected : (\d+)")
TOTALS = re.compile(r"^totals: (\d+)", re.MULTILINE)
QUIET = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
"""What every child runs with unless its environment says otherwise: the fixed hash seed, and the
numerical libraries' thread pools off (OpenBLAS's idle workers spin for as long as the child runs,
so what they count grows with how slowly callgrind runs: 1.4 M instructions a CrewAI run)."""


def instructions(
    script: str, arguments: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> int:
    """The instructions ``python script arguments...`` executes under callgrind (its output file
    thrown away): a RuntimeError with valgrind's last words when it gives no count."""
    return counted(script, arguments, timeout, env)[0]


def counted(
    script: str, arguments: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """:func:`instructions`, and what the child printed on its standard output."""
    done = _run(["--callgrind-out-file=/dev/null"], script, arguments, timeout, env)
    found = COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1)), done.stdout


MARK_FUNCTION = "getppid"
"""The C function callgrind dumps its counters before (``--dump-before``): :func:`mark` calls it.
Nothing else in the runtimes' children calls it; :func:`counted_between` checks that it was called
exactly twice."""


def mark() -> None:
    """In a child run by :func:`counted_between`: the start, then the end, of what is counted."""
    os.getppid()


def counted_between(
    script: str, arguments: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """The instructions ``python script arguments...`` executes between its two :func:`mark` calls
    (every thread's), and what it printed on its standard output."""
    with tempfile.TemporaryDirectory(prefix="callgrind-") as folder:
        out = os.path.join(folder, "out")
        options = [f"--callgrind-out-file={out}", f"--dump-before={MARK_FUNCTION}", "--dump-instr=no"]
        done = _run(options, script, arguments, timeout, env)
        dumps = sorted(name for name in os.listdir(folder) if name.startswith("out."))
        if dumps != ["out.1", "out.2"]:
            raise RuntimeError(
                f"{script}: {len(dumps)} marks where there should be 2 ({MARK_FUNCTION} called)"
            )
        with open(os.path.join(folder, "out.2"), encoding="utf-8", errors="replace") as between:
            found = TOTALS.search(between.read())
    if found is None:
        raise RuntimeError(f"no instruction count between the marks:\n{done.stderr[-2000:]}")
    return int(found.group(1)), done.stdout


def _run(
    options: Sequence[str],
    script: str,
    arguments: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None,
) -> subprocess.CompletedProcess[str]:
    command = ["valgrind", "--tool=callgrind", *options, sys.executable, script, *arguments]
    seeded = {**QUIET, **(os.environ if env is None else env)}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True, env=seeded)


def require_valgrind() -> None:
    """Exit saying how to install valgrind, where it is missing."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
