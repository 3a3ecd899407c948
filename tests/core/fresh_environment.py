"""The environment a test gives a process it starts: the guard's settings and nothing inherited.

A module of its own (not conftest's) so that test modules import it by a name no other folder of
tests has.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def clean_environment(**settings: str) -> dict[str, str]:
    """The environment of a fresh process: no OTEL_* or pytest variables, then ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    env["PYTHONPATH"] = str(REPO)
    env.update(settings)
    return env
