"""Every ``OTEL_GUARD_*`` name the project tells its users is one the guard reads.

README.md, every page under docs/, every file under examples/, the package's own docstrings and every
``--help`` text of the command line (each command's, and the processor's): a name there is a setting's
variable (``otel_guard.settings.ENV``) or one of the names that are no setting but no mistake either
(``otel_guard.settings.NOT_SETTINGS``: the processor's own options, each checked against the
processor's table where it is installed). A misspelt name in a doc is one a user copies, and the guard
then ignores it (with a warning at start, since: tests/core/test_unknown_settings.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_guard.cli import build_parser
from otel_guard.settings import ENV, NOT_SETTINGS

ROOT = Path(__file__).resolve().parents[1]
OTEL_GUARD_CLI = Path(sys.executable).parent / "otel-guard"
# A name, unless it is a family written as a prefix (OTEL_GUARD_*, OTEL_GUARD_PROCESSOR_<OPTION>,
# OTEL_GUARD_PROCESSOR_ alone).
NAME = re.compile(r"\bOTEL_GUARD_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_*<{])")
WARNING = "names no setting"  # the guard's warning quotes a wrong name on purpose
TEXT_SUFFIXES = {".md", ".py", ".txt", ".toml", ".yaml", ".yml", ".json", ".sh", ".env", ".ini", ".cfg", ""}


def known_names() -> set[str]:
    names = set(ENV.values())
    try:
        from otel_guard_processor.config import OPTIONS
    except ImportError:  # the processor is not installed: its names are taken by their prefix only
        return names
    return names | {option.env for option in OPTIONS}


def is_known(name: str, known: set[str]) -> bool:
    if name in known:
        return True
    if not name.startswith(NOT_SETTINGS):
        return False
    return not any(option.startswith(NOT_SETTINGS) for option in known)  # the processor's table is not here


def unknown_in(text: str, known: set[str]) -> list[str]:
    """The unknown names in ``text``, but in a line that shows the warning about one."""
    lines = [line for line in text.splitlines() if WARNING not in line]
    return sorted({name for line in lines for name in NAME.findall(line) if not is_known(name, known)})


def documents() -> list[Path]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    paths += [p for p in sorted((ROOT / "examples").rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES]
    paths += sorted((ROOT / "otel_guard").rglob("*.py"))
    return [p for p in paths if "__pycache__" not in p.parts]


def test_the_pattern_finds_names_and_leaves_families_out() -> None:
    text = "`OTEL_GUARD_TTL` and OTEL_GUARD_*, OTEL_GUARD_PROCESSOR_<OPTION>, OTEL_GUARD_MODE=observe"
    assert NAME.findall(text) == ["OTEL_GUARD_TTL", "OTEL_GUARD_MODE"]
    assert unknown_in(text, known_names()) == ["OTEL_GUARD_TTL"]
    assert unknown_in(f"otel-guard: OTEL_GUARD_TTL {WARNING} and is ignored", known_names()) == []
    assert unknown_in("OTEL_GUARD_PROCESSOR_FORWARD OTEL_GUARD_PROCESSOR_FORWARDS", known_names()) in (
        ["OTEL_GUARD_PROCESSOR_FORWARDS"],
        [],  # without the processor installed, its family is taken whole
    )


def test_every_name_in_the_readme_the_docs_the_examples_and_the_docstrings_is_real() -> None:
    known = known_names()
    found = {}
    for path in documents():
        unknown = unknown_in(path.read_text(encoding="utf-8", errors="replace"), known)
        if unknown:
            found[str(path.relative_to(ROOT))] = unknown
    assert found == {}
    assert len(documents()) > 20  # the pages are there to be read


def commands() -> list[list[str]]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    choices = list(getattr(subparsers, "choices", {}))
    assert {"demo", "keygen", "inspect", "processor"} <= set(choices)
    return [[], *[[command] for command in choices]]


@pytest.mark.integration
@pytest.mark.parametrize("command", commands(), ids=lambda command: " ".join(command) or "otel-guard")
def test_every_name_in_a_help_text_is_real(command: list[str]) -> None:
    completed = subprocess.run(
        [str(OTEL_GUARD_CLI), *command, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert "usage:" in completed.stdout
    assert unknown_in(completed.stdout, known_names()) == []
