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
