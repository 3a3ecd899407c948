"""The README is the user's guide, docs/ the reference: what they tell users to run runs as written.

Every complete Python block of the README and of ``docs/`` runs; the README's first loop prints what
the README says; the processor walkthrough works, its ports aside. The examples' own commands are run
by ``tests/examples``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))  # the reference pages the README links
PAGES = sorted((ROOT / "docs").rglob("*.md"))  # those and the pages they link (docs/runtimes/*.md)
GUIDE = [README, *(page.read_text(encoding="utf-8") for page in PAGES)]
RUNTIMES = ROOT / "docs" / "runtimes.md"
RUNTIME_PAGES = sorted((ROOT / "docs" / "runtimes").glob("*.md"))
RUNTIME_SECTIONS = [
    "What is guarded",
    "Where the chain travels",
    "What a refusal looks like to the model",
    "Budgets",
    "Guidance",
    "Beside other instrumentations",
    "Limits",
]
MAX_README_LINES = 390  # read in ten minutes

SECTIONS = [
    "Quickstart",
    "A first loop",
    "Guard the runtime you use",
    "My agent calls another service",
    "Budgets for a whole tree",
    "See every loop: the processor",
    "Dashboards and alerts",
    "Reference",
]


def test_every_top_level_section_is_there_in_order() -> None:
    assert re.findall(r"^## (.+)$", README, re.MULTILINE) == SECTIONS


def test_the_quickstart_has_the_two_commands() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert "otel-guard demo" in quickstart
    assert "./scripts/test" in quickstart
    assert (ROOT / "scripts" / "test").is_file()


def test_the_readme_is_a_short_guide_with_a_diagram_that_links_every_reference_page() -> None:
    assert len(README.splitlines()) <= MAX_README_LINES
    assert "```mermaid\n" in README
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)\)", README))
    assert linked == {f"docs/{page.name}" for page in DOCS}


def test_every_runtime_of_the_overview_has_its_page_and_every_page_is_linked() -> None:
    """docs/runtimes.md is the overview: each row of its table of runtimes links that runtime's page,
    and every page of docs/runtimes/ is a row."""
    overview = RUNTIMES.read_text(encoding="utf-8")
    rows = overview.split("\n| runtime (extra) |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    links = {row: re.match(r"\| \[[^]]+\]\((runtimes/[\w-]+\.md)\)", row) for row in rows}
    assert [row for row, link in links.items() if link is None] == []
    pages = {f"runtimes/{page.name}" for page in RUNTIME_PAGES}
    assert sorted(link.group(1) for link in links.values() if link) == sorted(pages)
    assert len(pages) >= 9


def test_every_runtime_page_has_the_same_sections_in_the_same_order() -> None:
    for page in RUNTIME_PAGES:
        text = page.read_text(encoding="utf-8")
        assert re.findall(r"^## (.+)$", text, re.MULTILINE) == RUNTIME_SECTIONS, page.name
        top = text.split("\n## ", 1)[0]
        assert "**Tested**" in top, page.name  # the versions, and the switch-on lines, come first
        assert "```python\n" in top, page.name


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    outside_code = re.sub(r"```.*?```", "", text, flags=re.S)
    for heading in re.findall(r"^#{1,6} (.+)$", outside_code, re.MULTILINE):
        name, n = slug(heading), 1
        while name in found:
            name, n = f"{slug(heading)}-{n}", n + 1
        found.add(name)
    return found


def test_every_link_between_the_pages_leads_to_a_page_and_a_heading_that_exist() -> None:
    broken = []
    for page in [ROOT / "README.md", *PAGES]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.is_file() or (anchor and anchor not in anchors(linked.read_text(encoding="utf-8"))):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_every_benchmark_the_guide_names_exists() -> None:
    named = {path for text in GUIDE for path in re.findall(r"bench/[\w.]+\.py", text)}
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


def python_blocks(texts: list[str] = GUIDE) -> list[str]:
    """The Python code blocks of the README and docs/, dedented (some stand inside list items)."""
    import textwrap

    return [
        textwrap.dedent(block) for text in texts for block in re.findall(r"```python\n(.*?)```", text, re.S)
    ]


def is_complete(block: str) -> bool:
    """A block that starts with its imports and elides nothing (``...``) is a program to run as is."""
    return block.lstrip().startswith(("import ", "from ")) and "..." not in block


def is_marked_fragment(block: str) -> bool:
    """A fragment of a program (a line to add to an app, a call to make) says so on its first line."""
    return block.lstrip().startswith("# fragment:")


def test_every_python_block_is_a_program_or_says_it_is_a_fragment() -> None:
    unmarked = [block for block in python_blocks() if not (is_complete(block) or is_marked_fragment(block))]
    assert unmarked == []


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

    first = python_blocks([README])[0]
    printed = README.split(first.rstrip() + "\n```", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    result = subprocess.run(
        [sys.executable, "-c", first], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == printed


def test_the_budget_example_prints_what_the_readme_says() -> None:
    import subprocess
    import sys

    section = README.split("## Budgets for a whole tree", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    printed = section.split("```\n\nprints `", 1)[1].split("`", 1)[0] + "\n"
    result = subprocess.run(
        [sys.executable, "-c", block], check=False, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == printed


def test_the_processor_walkthrough_counts_the_loop_as_the_readme_says(tmp_path: Path) -> None:
    """The README's processor commands, run in order (on free ports): the loop is counted once."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    section = README.split("## See every loop: the processor", 1)[1].split("\n## ", 1)[0]
    commands = section.split("```sh\n", 1)[1].split("```", 1)[0]
    expected = section.split("```text\n", 1)[1].split("```", 1)[0].strip()
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(str(probe.getsockname()[1]))
    commands = commands.replace("4317", ports[0]).replace("4390", ports[1]).replace("\\\n", " ")
    # The README's .venv is this test's environment; nothing else is on PATH (no activated venv).
    commands = commands.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    lines = [line.split("  #")[0].strip() for line in commands.splitlines() if line.strip()]
    assert lines[0].endswith("pip install -q ./processor '.[processor]'")
    start, run, scrape = lines[1].rstrip("&").strip(), lines[2], lines[3]
    # A fresh shell: no OTEL_* at all, so the agent sends its traces, metrics and logs to the one
    # endpoint, and the processor takes all three.
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    processor = subprocess.Popen(start, shell=True, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)  # fmt: skip
    try:
        assert processor.stderr is not None
        deadline = time.monotonic() + 30
        while "ready:" not in processor.stderr.readline():
            assert time.monotonic() < deadline, "the processor did not start"
            assert processor.poll() is None, "the processor exited"
        ran = subprocess.run(
            run, check=False, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert ran.returncode == 0, ran.stderr
        assert "after 6 tool calls" in ran.stdout
        for failure in ("UNIMPLEMENTED", "Failed to export", "Traceback"):
            assert failure not in ran.stderr, ran.stderr
        # The count is made --count-wait (10 s) after the loop, as the README says; the scrape is
        # repeated until then (and a little past it, for the exporter's last batch, sent at exit).
        deadline = time.monotonic() + 25
        while True:
            scraped = subprocess.run(
                scrape, check=False, shell=True, env=env, capture_output=True, text=True, timeout=10
            )
            if expected in scraped.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert scraped.stdout.strip() == expected
    finally:
        os.killpg(processor.pid, signal.SIGTERM)
        processor.wait(10)


def shell_blocks(texts: list[str] = GUIDE) -> list[str]:
    import textwrap

    return [
        textwrap.dedent(block)
        for text in texts
        for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text, re.S)
    ]


def test_every_shell_block_is_a_command_that_names_what_exists_or_says_it_is_a_fragment() -> None:
    """Shell blocks run on the user's machine: a block not marked as a fragment names only files,
    extras and commands that this checkout has (the examples' and the walkthrough's are also run,
    by tests/examples and the test above)."""
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "optional-dependencies"
        ]
    )
    commands = {
        "pip",
        "python",
        "python3",
        "otel-guard",
        "opentelemetry-instrument",
        "promtool",
        "curl",
        "export",
        "cargo",  # the processor's engine (docs/development.md)
    }
    for block in shell_blocks():
        if block.lstrip().startswith("# fragment:"):
            continue
        for path in re.findall(r"(?:examples|dashboards|scripts|bench|docs)/[\w./-]*\w", block):
            assert (ROOT / path).exists(), path
        for extra in re.findall(r"'\.\[([\w,-]+)\]'", block):
            assert set(extra.split(",")) <= extras, extra
        for line in block.replace("\\\n", " ").splitlines():
            words = [w for w in line.split("#", 1)[0].split() if "=" not in w or w.startswith(("-", "'"))]
            if words:
                command = words[0].rsplit("/", 1)[-1]
                assert command in commands or words[0].startswith("./scripts/"), line
