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

``examples/services`` is three FastAPI services of three runtimes calling each other over HTTP: its
environment is the README's install for agents behind HTTP (``.[services,...]``, OpenTelemetry's own
ASGI, FastAPI and HTTP client instrumentations among it), so its guarded run also shows the guard
working beside them: one trace across the services, the chain carried, the loop refused at the
service where it began, the refusal read by the model as its tool's error, and the user answered 200.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from subprocess import PIPE
from typing import Any

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
    "dspy": "dspy",
    "agno": "agno",
    "haystack": "haystack",
    "claude_agent_sdk": "claude-agent-sdk",
    "services": "services",
}
# What the README installs for an example whose environment holds more than its one extra.
BESIDE_THE_FIRST_FIVE = "dspy,agno,haystack,claude-agent-sdk"  # one install line for the four
INSTALLS = {
    "services": "services,asgi,pydantic-ai,openai-agents,langgraph",
    **dict.fromkeys(["dspy", "agno", "haystack", "claude_agent_sdk"], BESIDE_THE_FIRST_FIVE),
}
# How each example runs without the guard: plainly, but for the ASGI middleware, which is the app's
# own code (the example leaves it out when asked).
WITHOUT_GUARD = {"asgi": ["--without-guard"]}
MAX_TOOL_CALLS = 6  # each example's scripts give up after this many tool calls in all
GUARDED_TOOL_CALLS = 2  # planner -> budget, then budget -> planner: refused
# concierge -> pricing -> fx, then fx -> concierge: refused (the services' loop is one longer)
GUARDED = {"services": 3}
# What the README puts before `opentelemetry-instrument`: spans on the console, nothing sent anywhere.
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
TIMEOUT = 60.0
# Three services of three runtimes, each started in a process of its own: their imports take longer.
TIMEOUTS = {"services": 110.0}  # under the suite's 120 s a test
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


def run(
    command: list[str], env: dict[str, str], timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    # A session of its own: past the time bound, the example goes with every process it started
    # (the services example's servers), not the example alone.
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=PIPE, stderr=PIPE, text=True, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
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
    extras = INSTALLS.get(example, EXAMPLES[example])
    install = [line for line in lines if f"pip install -q '.[{extras}]'" in line]
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
    result = run(command, environment(EXAMPLES[example]), TIMEOUTS.get(example, TIMEOUT))
    assert tool_calls(result.stdout) == MAX_TOOL_CALLS


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_under_the_guard_the_first_bounce_is_refused_and_the_model_answers(example: str) -> None:
    # The README's command as written, its environment put where scripts/bootstrap made it, run from
    # a shell whose PATH holds no environment at all.
    venv = ROOT / ".venv-examples" / EXAMPLES[example]
    environment(EXAMPLES[example])  # says how to make it if it is missing
    command = VENV_BIN.sub(f"{venv}/bin/", readme_lines(example)[1]).split()
    env = {**environment(EXAMPLES[example]), **CONSOLE, "PATH": "/usr/local/bin:/usr/bin:/bin"}
    result = run(command, env, TIMEOUTS.get(example, TIMEOUT))
    assert tool_calls(result.stdout) == GUARDED.get(example, GUARDED_TOOL_CALLS)
    # The console exporter's spans: the guard's refusal is among them, with its reason.
    assert '"otel_guard.decision": "refuse"' in result.stdout
    assert '"otel_guard.reason": "cycle"' in result.stdout


# -- examples/services: three services, three runtimes, OpenTelemetry's HTTP instrumentations beside --

SERVICES = ("concierge", "pricing", "fx")
HEALTHY_HOPS = [
    ("concierge", "invoke_agent concierge", "allow"),
    ("concierge", "execute_tool ask_pricing", "allow"),
    ("pricing", "invoke_agent pricing", "allow"),
    ("pricing", "execute_tool ask_fx", "allow"),
    ("fx", "invoke_agent fx", "allow"),
]
LOOP_HOPS = [
    *HEALTHY_HOPS,
    ("fx", "execute_tool ask_concierge", "allow"),
    ("concierge", "invoke_agent concierge", "refuse"),
]
REFUSAL = (
    "  fx got ask_concierge's error result: Refused by otel-guard (a2a_delegation_cycle, reason: cycle): "
    "Delegation cycle: agent concierge is already in chain concierge → ask_pricing → pricing → ask_fx → fx"
    " → ask_concierge."
)


def console_spans(stdout: str) -> tuple[list[dict[str, Any]], str]:
    """The spans the console exporters printed (each a JSON object starting on a line ``{``), and
    the rest of ``stdout``: what the programs printed themselves."""
    decoder, spans, rest, at = json.JSONDecoder(), [], [], 0
    while (start := stdout.find("\n{\n", at)) >= 0:
        rest.append(stdout[at : start + 1])
        span, at = decoder.raw_decode(stdout, start + 1)
        spans.append(span)
    return spans, "".join([*rest, stdout[at:]])


def http_status(span: dict[str, Any]) -> int:
    """An HTTP span's status code, in the stable conventions' attribute or the older one."""
    attributes = span["attributes"]
    return int(attributes.get("http.response.status_code", attributes.get("http.status_code", 0)))


def test_the_services_example_answers_a_loop_with_200_and_one_trace_across_the_services() -> None:
    """The README's command in ``.venv-examples/services``: the healthy request runs through the three
    services, the loop is refused where it began and read by fx's model as its tool's error, each
    request is one trace across the processes (OpenTelemetry's own instrumentations continue it) and
    one chain (the guard carries it), and the health checks are no hops."""
    venv = ROOT / ".venv-examples" / "services"
    command = VENV_BIN.sub(f"{venv}/bin/", readme_lines("services")[1]).split()
    # Spans exported only as each service stops (one after the other), never two processes at once.
    path = {"PATH": "/usr/local/bin:/usr/bin:/bin", "OTEL_BSP_SCHEDULE_DELAY": "600000"}
    result = run(command, {**environment("services"), **CONSOLE, **path}, TIMEOUTS["services"])

    spans, printed = console_spans(result.stdout)
    lines = printed.splitlines()
    assert (
        "the concierge answers HTTP 200 (2 tool calls): 'concierge: pricing: fx: 1 EUR = 1.08 USD'" in lines
    )
    assert REFUSAL in [line[: len(REFUSAL)] for line in lines]
    loop_answer = "'concierge: pricing: fx: 1 EUR = 1.08 USD (ask_concierge failed: unconfirmed)'"
    assert f"the concierge answers HTTP 200 (3 tool calls): {loop_answer}" in lines
    # The one line of the end (the spans of this program's own HTTP calls may follow it).
    ending = [line for line in lines if TOOL_CALLS.search(line)]
    assert ending == [f"the concierge's answer to the loop: {loop_answer} after 3 tool calls"]
    # No error but the refusal: no traceback printed by any process (the spans may record the refusal
    # as the failed tool call's exception, with its stack), no 500 answered anywhere.
    for bad in ("Traceback", "HTTP 500", "Internal Server Error", "Exception in ASGI application"):
        assert bad not in printed + result.stderr, bad
    statuses = sorted(http_status(s) for s in spans if s["kind"] == "SpanKind.SERVER")
    assert statuses == [200] * 6 + [409]  # two requests through three services, and the refused call
    service = {span["context"]["span_id"]: span["resource"]["attributes"]["service.name"] for span in spans}
    kind = {span["context"]["span_id"]: span["kind"] for span in spans}
    traces: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        traces.setdefault(span["context"]["trace_id"], []).append(span)
    guarded = [
        trace for trace in traces.values() if any("otel_guard.decision" in s["attributes"] for s in trace)
    ]
    # Every hop is in one of the two requests' traces: the health checks made none.
    assert len(guarded) == 2
    for trace, expected in zip(sorted(guarded, key=len), (HEALTHY_HOPS, LOOP_HOPS), strict=True):
        hops = sorted(
            (s for s in trace if "otel_guard.decision" in s["attributes"]),
            key=lambda s: s["attributes"]["otel_guard.chain.depth"],
        )
        assert [(service[s["context"]["span_id"]], s["name"], s["attributes"]["otel_guard.decision"])
                for s in hops] == expected  # fmt: skip
        # One chain: the same root in every service, each hop one place deeper (a service is one place).
        assert len({s["attributes"]["otel_guard.chain.root"] for s in hops}) == 1
        assert [s["attributes"]["otel_guard.chain.depth"] for s in hops] == list(range(1, len(expected) + 1))
        assert hops[-1]["attributes"]["otel_guard.chain.agents"] == [n.split()[1] for _, n, _ in expected]
        # One trace: each service's SERVER span (OpenTelemetry's FastAPI instrumentation) is the child of
        # its caller's CLIENT span (OpenTelemetry's httpx or requests instrumentation) in another process.
        servers = [s for s in trace if s["kind"] == "SpanKind.SERVER"]
        assert sorted({service[s["context"]["span_id"]] for s in servers}) == sorted(SERVICES)
        for server in servers:
            assert kind[server["parent_id"]] == "SpanKind.CLIENT"
            assert service[server["parent_id"]] != service[server["context"]["span_id"]]
    loop = max(guarded, key=len)
    refused = [s for s in loop if s["attributes"].get("otel_guard.decision") == "refuse"]
    assert [s["attributes"]["otel_guard.reason"] for s in refused] == ["cycle"]
