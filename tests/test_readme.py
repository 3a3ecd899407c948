"""The README is the user's guide: its sections are all there, and what it tells users to run exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

SECTIONS = [
    "Quickstart",
    "Install",
    "The API",
    "Settings",
    "The rules, on the Planner / Budget example",
    "On the wire",
    "Security model",
    "Telemetry",
    "Agent runtimes: guarded with no code change",
    "The collector-side processor",
    "Dashboards and alerts",
    "Performance",
    "Development",
    "Limits",
]


def test_every_top_level_section_is_there_in_order() -> None:
    assert re.findall(r"^## (.+)$", README, re.MULTILINE) == SECTIONS


def test_the_quickstart_has_the_two_commands() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert "otel-guard demo" in quickstart
    assert "./scripts/test" in quickstart
    assert (ROOT / "scripts" / "test").is_file()


def test_every_benchmark_the_readme_names_exists() -> None:
    named = set(re.findall(r"bench/[\w.]+\.py", README))
    assert named >= {"bench/inline_overhead.py", "bench/processor_throughput.py", "bench/runtime_overhead.py"}
    for path in named:
        assert (ROOT / path).is_file(), path


def test_every_runtime_has_its_section() -> None:
    for heading in (
        "### A2A",
        "### MCP",
        "### OpenAI Agents SDK",
        "### LangGraph",
        "### pydantic-ai",
        "### Any HTTP agent",
    ):
        assert re.search(rf"^{re.escape(heading)}", README, re.MULTILINE), heading


def python_blocks() -> list[str]:
    """The README's Python code blocks, dedented (some stand inside list items)."""
    import textwrap

    return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", README, re.S)]


def is_complete(block: str) -> bool:
    """A block that starts with its imports and elides nothing (``...``) is a program to run as is;
    the others are fragments of one (a line to add to an app, a call to make)."""
    return block.lstrip().startswith(("import ", "from ")) and "..." not in block


def test_every_complete_python_block_runs_as_written(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    complete = [block for block in python_blocks() if is_complete(block)]
    assert len(complete) >= 7  # the first loop, the instrumentors, the ASGI middleware
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    for block in complete:
        result = subprocess.run(
            [sys.executable, "-c", block],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"{block}\n{result.stderr}"


def test_the_first_example_shows_the_refusal_it_says_it_prints() -> None:
    import subprocess
    import sys

    first = python_blocks()[0]
    printed = README.split(first.rstrip() + "\n```", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    result = subprocess.run(
        [sys.executable, "-c", first], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == printed
