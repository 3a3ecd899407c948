"""Every ``examples/<runtime>/app.py``, run the way the README says, in an environment with only its extra.

``scripts/bootstrap`` makes ``.venv-examples/<extra>`` for each example: otel-guard installed with that
extra and nothing else (``pip install '.[<extra>]'``, as the README's install line). Each example is
run twice, as a user would:

- plain (``python examples/<runtime>/app.py``; the ASGI example with ``--without-guard``, since its
  middleware is the app's own code): nothing stops the loop, and the scripted models bounce until they
  give up (``MAX_TOOL_CALLS``);
- under the guard (the README's ``opentelemetry-instrument`` command, settings from the environment
  only): the first bounce back into an agent already on the path is refused, the model reads the
  refusal as its tool's error and answers, and the spans on the console show the refusal.

Both runs end well within their time bound, exit 0, and print no traceback or export error.
Each example ends with one line ``... after N tool calls``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# example folder -> the extra it is run with
EXAMPLES = {
    "pydantic_ai": "pydantic-ai",
    "openai_agents": "openai-agents",
    "langgraph": "langgraph",
    "mcp": "mcp",
    "a2a": "a2a",
    "asgi": "asgi",
    "google_adk": "google-adk",
    "crewai": "crewai",
    "strands": "strands",
    "smolagents": "smolagents",
    "agent_framework": "agent-framework",
    "llama_index": "llama-index",
}
# How each example runs without the guard: plainly, but for the ASGI middleware, which is the app's
# own code (the example leaves it out when asked).
WITHOUT_GUARD = {"asgi": ["--without-guard"]}
MAX_TOOL_CALLS = 6  # each example's scripts give up after this many tool calls in all
GUARDED_TOOL_CALLS = 2  # planner -> budget, then budget -> planner: refused
# What the README puts before `opentelemetry-instrument`: spans on the console, nothing sent anywhere.
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
TIMEOUT = 60.0
TOOL_CALLS = re.compile(r"after (\d+) tool calls")
NOT_IN_STDERR = ("Traceback", "Failed to export", "Exception while exporting", "Transient error")


def environment(extra: str) -> dict[str, str]:
    """A user's shell with the example's environment first on PATH and no OTEL_* settings of ours."""
    venv = ROOT / ".venv-examples" / extra
    if not (venv / "bin" / "python").exists():
        raise AssertionError(f"{venv} is missing: scripts/bootstrap makes it (scripts/test runs bootstrap)")
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    return env


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    for bad in NOT_IN_STDERR:
        assert bad not in result.stderr, f"{command}: {bad!r} on stderr:\n{result.stderr[-3000:]}"
    return result


def tool_calls(stdout: str) -> int:
    found = TOOL_CALLS.findall(stdout)
    assert found, f"no 'after N tool calls' line in:\n{stdout[-3000:]}"
    return int(found[-1])


VENV_BIN = re.compile(r"(?<![\w/])\.venv[\w-]*/bin/")


def readme_lines(example: str) -> tuple[str, str]:
    """The README's install line and run line for ``example``, as written."""
    lines = README.read_text(encoding="utf-8").splitlines()
    install = [line for line in lines if f"pip install -q '.[{EXAMPLES[example]}]'" in line]
    runs = [line for line in lines if line.startswith(".venv") and f"examples/{example}/app.py" in line]
    assert len(install) == 1, install
    assert len(runs) == 1, runs
    return install[0], runs[0]


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_the_readme_shows_how_to_run_the_example_without_an_activated_environment(example: str) -> None:
    install, command = readme_lines(example)
    # Every program named lives in one environment the README made: no activated venv is needed.
    venvs = set(VENV_BIN.findall(command)) | {VENV_BIN.findall(install)[-1]}
    assert len(venvs) == 1, (install, command)
    assert command.split() == [f"{next(iter(venvs))}opentelemetry-instrument", f"{next(iter(venvs))}python",
                               f"examples/{example}/app.py"]  # fmt: skip


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_without_the_guard_the_example_loops_until_its_script_gives_up(example: str) -> None:
    command = ["python", f"examples/{example}/app.py", *WITHOUT_GUARD.get(example, [])]
    result = run(command, environment(EXAMPLES[example]))
    assert tool_calls(result.stdout) == MAX_TOOL_CALLS


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_under_the_guard_the_first_bounce_is_refused_and_the_model_answers(example: str) -> None:
    # The README's command as written, its environment put where scripts/bootstrap made it, run from
    # a shell whose PATH holds no environment at all.
    venv = ROOT / ".venv-examples" / EXAMPLES[example]
    environment(EXAMPLES[example])  # says how to make it if it is missing
    command = VENV_BIN.sub(f"{venv}/bin/", readme_lines(example)[1]).split()
    env = {**environment(EXAMPLES[example]), **CONSOLE, "PATH": "/usr/local/bin:/usr/bin:/bin"}
    result = run(command, env)
    assert tool_calls(result.stdout) == GUARDED_TOOL_CALLS
    # The console exporter's spans: the guard's refusal is among them, with its reason.
    assert '"otel_guard.decision": "refuse"' in result.stdout
    assert '"otel_guard.reason": "cycle"' in result.stdout
