"""Counting what a benchmark's child process executes, in instructions, under valgrind's callgrind.

Instruction counts do not depend on what else a shared machine is doing: the same run gives the
same figure within a fraction of a per cent, where times move with the load. Every child runs with a
fixed hash seed (``PYTHONHASHSEED=0`` unless the environment given sets one): the same dict and set
layouts, and so the same garbage collections, in every child (without it, a CrewAI run's count moved
by tens of millions of instructions from one child to the next), and no thread pool of a numerical
library (:data:`QUIET`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

COLLECTED = re.compile(r"Collected : (\d+)")
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
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        script,
        *arguments,
    ]
    seeded = {**QUIET, **(os.environ if env is None else env)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True, env=seeded)
    found = COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1)), done.stdout


def require_valgrind() -> None:
    """Exit saying how to install valgrind, where it is missing."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
