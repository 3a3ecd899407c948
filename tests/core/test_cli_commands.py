"""The ``otel-guard`` command (docs/spec.md §7): demo, keygen, inspect, --help, exit statuses.

Each test runs the installed console script in a fresh process with a clean environment.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_guard.chain import Chain, Hop, Keyring, encode, new_root

pytestmark = pytest.mark.integration

OTEL_GUARD = str(Path(sys.executable).parent / "otel-guard")
KEYGEN_LINE = re.compile(r"OTEL_GUARD_KEYS=([A-Za-z0-9._~-]{1,64}):([A-Za-z0-9_-]+)")

Run = Callable[..., Any]


def token(keyring: Keyring | None, *hops: Hop, workspace: str = "default") -> tuple[str, Chain]:
    now = time.time()
    chain = Chain(hops or (Hop("planner", "plan"), Hop("budget")), new_root(), workspace, now, now + 300)
    return encode(chain, keyring), chain


# -- keygen -----------------------------------------------------------------------------------------


def test_keygen_prints_one_fresh_key_in_the_environment_form(run_command: Run) -> None:
    first = run_command([OTEL_GUARD, "keygen"])
    second = run_command([OTEL_GUARD, "keygen"])
    assert (first.returncode, second.returncode) == (0, 0)
    assert first.stderr == ""
    match = KEYGEN_LINE.fullmatch(first.stdout.strip())
    assert match is not None, first.stdout
    secret = base64.urlsafe_b64decode(match.group(2) + "=" * (-len(match.group(2)) % 4))
    assert len(secret) == 32
    assert first.stdout != second.stdout


def test_keygen_with_a_key_id(run_command: Run) -> None:
    completed = run_command([OTEL_GUARD, "keygen", "--kid", "travel-2026"])
    assert completed.returncode == 0
    match = KEYGEN_LINE.fullmatch(completed.stdout.strip())
    assert match is not None
    assert match.group(1) == "travel-2026"


def test_the_key_keygen_prints_signs_and_verifies(run_command: Run) -> None:
    line = run_command([OTEL_GUARD, "keygen"]).stdout.strip()
    keys = line.partition("=")[2]
    signed, _ = token(Keyring.parse(keys))
    verified = run_command([OTEL_GUARD, "inspect", signed], OTEL_GUARD_KEYS=keys)
    assert verified.returncode == 0, verified.stderr
    assert "signature verified" in verified.stdout


# -- inspect ----------------------------------------------------------------------------------------


def test_inspect_prints_the_verified_chain(run_command: Run, make_key: Callable[[str], Any]) -> None:
    key = make_key("k1")
    signed, chain = token(key.keyring(), Hop("planner", "plan"), Hop("budget"), Hop("fx", "convert"))
    completed = run_command([OTEL_GUARD, "inspect", signed], OTEL_GUARD_KEYS=key.env)
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert re.search(rf"^root:\s+{chain.root}$", out, re.MULTILINE)
    assert re.search(r"^workspace:\s+default$", out, re.MULTILINE)
    assert re.search(r"^issued at:\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00$", out, re.MULTILINE)
    assert re.search(r"^expires at:\s+\d{4}-", out, re.MULTILINE)
    assert re.search(r"^status:\s+signature verified$", out, re.MULTILINE)
    assert re.search(r"^hops:\s+3$", out, re.MULTILINE)
    hop_lines = [line.strip() for line in out.splitlines() if re.match(r"\s+\d+\. ", line)]
    assert hop_lines == ["1. planner  (skill plan)", "2. budget", "3. fx  (skill convert)"]


def test_inspect_shows_an_expired_chain_and_fails(run_command: Run) -> None:
    now = time.time()
    chain = Chain((Hop("planner", "plan"),), new_root(), "default", now - 900, now - 600)
    completed = run_command([OTEL_GUARD, "inspect", encode(chain, None)])
    assert completed.returncode == 1
    assert re.search(r"^hops:\s+1$", completed.stdout, re.MULTILINE)
    assert re.fullmatch(
        r"otel-guard inspect: expired: Delegation chain expired \d+ s ago \(lifetime 300 s from its "
        r"first hop\); the guard refuses it\n",
        completed.stderr,
    )


def test_inspect_refuses_what_the_guard_refuses_a_chain_of_another_workspace(
    run_command: Run, make_key: Callable[[str], Any]
) -> None:
    key = make_key("k1")
    signed, _ = token(key.keyring(), workspace="finance")
    refused = run_command([OTEL_GUARD, "inspect", signed], OTEL_GUARD_KEYS=key.env)
    assert refused.returncode == 1
    assert (
        "foreign_workspace: Delegation chain belongs to workspace 'finance', not 'default'" in refused.stderr
    )
    accepted = run_command(
        [OTEL_GUARD, "inspect", signed], OTEL_GUARD_KEYS=key.env, OTEL_GUARD_WORKSPACE="finance"
    )
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.parametrize(
    ("issued", "expires"),
    [(0, 1e308), (-1e300, 10), (float("nan"), 10), (10, 5), (0, 2**40)],
    ids=["exp 1e308", "iat -1e300", "iat NaN", "exp before iat", "exp past 2242"],
)
def test_inspect_of_impossible_times_is_bad_signature_never_a_traceback(
    run_command: Run, issued: float, expires: float
) -> None:
    claims = {
        "v": 1,
        "root": new_root(),
        "ws": "default",
        "hops": [["planner", None]],
        "iat": issued,
        "exp": expires,
    }
    header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    completed = run_command([OTEL_GUARD, "inspect", f"{header}.{payload}."])
    assert completed.returncode == 1
    assert completed.stderr.startswith("otel-guard inspect: bad_signature: ")
    assert "Traceback" not in completed.stderr


def test_inspect_reads_the_token_as_the_guard_does_spaces_included(run_command: Run) -> None:
    unsigned, _ = token(None)
    completed = run_command([OTEL_GUARD, "inspect", f" {unsigned} "])
    assert completed.returncode == 1
    assert "bad_signature" in completed.stderr


def test_inspect_without_keys_says_the_signature_was_not_checked(run_command: Run) -> None:
    unsigned, _ = token(None)
    completed = run_command([OTEL_GUARD, "inspect", unsigned])
    assert completed.returncode == 0
    assert re.search(r"^status:\s+unsigned", completed.stdout, re.MULTILINE)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("garbage", "not a JWS"),
        ("other key", "signature does not match"),
        ("unsigned", "unsigned"),
        ("unknown key id", "unknown key id"),
        ("truncated", ""),
    ],
)
def test_inspect_a_bad_token_fails_with_the_reason_on_stderr(
    run_command: Run, make_key: Callable[[str], Any], case: str, reason: str
) -> None:
    key = make_key("k1")
    good, _ = token(key.keyring())
    bad = {
        "garbage": "garbage",
        "other key": token(make_key("k1").keyring())[0],
        "unsigned": token(None)[0],
        "unknown key id": token(make_key("k2").keyring())[0],
        "truncated": good[:-10],
    }[case]
    completed = run_command([OTEL_GUARD, "inspect", bad], OTEL_GUARD_KEYS=key.env)
    assert completed.returncode == 1
    assert completed.stdout == ""
    assert "bad_signature" in completed.stderr
    assert reason in completed.stderr


def test_inspect_with_bad_keys_in_the_environment_fails_naming_the_variable(run_command: Run) -> None:
    unsigned, _ = token(None)
    completed = run_command([OTEL_GUARD, "inspect", unsigned], OTEL_GUARD_KEYS="k1:tooshort")
    assert completed.returncode == 1
    assert "OTEL_GUARD_KEYS" in completed.stderr


# -- usage and help ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["inspect"],
        ["inspect", "a", "b"],
        ["keygen", "--colour"],
        ["keygen", "--kid", "a:b"],  # a key id OTEL_GUARD_KEYS would not accept
        ["keygen", "--kid", ""],  # not a random one in its place
        ["demo", "extra"],
        ["--nope"],
    ],
    ids=lambda argv: " ".join(argv) or "no command",
)
def test_bad_usage_exits_2_with_usage_on_stderr(run_command: Run, argv: list[str]) -> None:
    completed = run_command([OTEL_GUARD, *argv])
    assert completed.returncode == 2
    assert "usage:" in completed.stderr
    assert completed.stdout == ""


@pytest.mark.parametrize("command", ["demo", "keygen", "inspect"])
def test_an_unknown_option_shows_the_commands_own_usage(run_command: Run, command: str) -> None:
    argv = [OTEL_GUARD, command, "--bogus", *(["TOKEN"] if command == "inspect" else [])]
    completed = run_command(argv)
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        completed.stderr.splitlines()[0],
        f"otel-guard {command}: error: unrecognized arguments: --bogus",
    ]
    assert completed.stderr.startswith(f"usage: otel-guard {command} ")


@pytest.mark.parametrize(
    "command", [[], ["demo"], ["keygen"], ["inspect"]], ids=lambda c: " ".join(c) or "top"
)
def test_every_command_has_help(run_command: Run, command: list[str]) -> None:
    completed = run_command([OTEL_GUARD, *command, "--help"])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"usage: otel-guard {' '.join(command)}".rstrip())
    if not command:
        for name in ("demo", "keygen", "inspect", "processor"):
            assert name in completed.stdout


def test_processor_has_help(run_command: Run) -> None:
    completed = run_command([OTEL_GUARD, "processor", "--help"])
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: otel-guard processor")
    for flag in ("--listen", "--http-listen", "--forward", "--prometheus"):
        assert flag in completed.stdout


# -- demo -------------------------------------------------------------------------------------------


def _tables(output: str) -> dict[str, list[list[str]]]:
    """The demo's tables: title -> rows of cells (columns are separated by two or more spaces)."""
    tables: dict[str, list[list[str]]] = {}
    title = ""
    for line in output.splitlines():
        if line and not line.startswith(" "):
            title = line
        elif re.match(r"  \d+ ", line):
            tables.setdefault(title, []).append(re.split(r"\s{2,}", line.strip()))
    return tables


def test_demo_prints_the_seed_tables_with_the_right_decisions(run_command: Run) -> None:
    completed = run_command([OTEL_GUARD, "demo"], timeout=60)
    assert completed.returncode == 0, completed.stderr
    tables = _tables(completed.stdout)
    by_rule = {
        next(t for t in tables if t.startswith(prefix)): prefix
        for prefix in ("Default rule", "Strict rule", "Observe")
    }
    default, strict, observe = (tables[t] for t in by_rule)
    assert default == [
        ["1", "user → planner", "plan", "none", "allowed"],
        ["2", "planner → budget", "price", "planner", "allowed"],
        ["3", "budget → planner", "itinerary", "planner → budget", "allowed"],
        ["4", "planner → budget", "price", "planner → budget → planner", "refused (cycle)"],
    ]
    assert strict == [
        ["1", "user → planner", "plan", "none", "allowed"],
        ["2", "planner → budget", "price", "planner", "allowed"],
        ["3", "budget → planner", "itinerary", "planner → budget", "refused (cycle)"],
    ]
    assert [row[-1] for row in observe] == ["allowed"] * 3 + ["would refuse (cycle)"] * 3
    assert (
        "409 a2a_delegation_cycle: Delegation cycle: agent planner is already in chain planner → budget"
        in (completed.stdout)
    )
    runaway = completed.stdout[completed.stdout.index("A -> A runaway") :]
    assert "its body ran 5 times" in runaway
    assert "DelegationRefused" in runaway
    assert "(max_name_depth) is 5" in runaway
    assert "allow=5, refuse=1" in runaway


@pytest.mark.parametrize(
    "environment",
    [
        {"OTEL_GUARD_MODE": "off"},
        {"OTEL_GUARD_MAX_DEPTH": "2", "OTEL_GUARD_CYCLE_RULE": "none"},
    ],
    ids=["mode off", "depth 2 and no cycle rule"],
)
def test_demo_runs_on_its_embedded_defaults_whatever_the_environment(
    run_command: Run, environment: dict[str, str]
) -> None:
    completed = run_command([OTEL_GUARD, "demo"], timeout=60, **environment)
    assert completed.returncode == 0, completed.stderr[-500:]
    tables = _tables(completed.stdout)
    default = next(rows for title, rows in tables.items() if title.startswith("Default rule"))
    assert [row[-1] for row in default] == ["allowed"] * 3 + ["refused (cycle)"]
    assert "its body ran 5 times" in completed.stdout


def test_demo_runs_with_keys_in_the_environment(run_command: Run, make_key: Callable[[str], Any]) -> None:
    completed = run_command([OTEL_GUARD, "demo"], timeout=60, OTEL_GUARD_KEYS=make_key("k1").env)
    assert completed.returncode == 0, completed.stderr
    assert "refused (cycle)" in completed.stdout


# -- demo --stack ----------------------------------------------------------------------------------


def test_demo_stack_shows_the_loop_across_processes_counted_by_the_processor(run_command: Run) -> None:
    import psutil

    completed = run_command([OTEL_GUARD, "demo", "--stack"], timeout=60)
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    # The agents said it: the chain arrived signed and verified, the bounce was refused at the door.
    assert "[budget] budget: a signed chain arrived and verified: planner → budget" in out
    assert "[budget] budget: planner refused (409): Delegation cycle: agent planner" in out
    assert "planner's answer: planner's answer, from budget's: budget answers with what it has" in out
    # The processor counted the loop once, from spans of two processes.
    assert 'otel_guard_cycles_total{cycle="planner>budget>planner",kind="cross_function"} 1.0' in out
    assert 'otel_guard_span_decisions_total{agent="planner",decision="refuse",reason="cycle"} 1.0' in out
    # The trace store got one trace across both services.
    tree = out.split("the trace, as the trace store received it:\n", 1)[1].split("\n\n", 1)[0]
    assert tree.splitlines() == [
        "  invoke_agent planner  [planner]  allow",
        "    invoke_agent budget  [budget]  allow",
        "      invoke_agent planner  [planner]  refuse (cycle)",
    ]
    assert out.rstrip().splitlines()[-2].startswith("next: README.md")
    # From the loop to its trace: the exemplar names the trace and span where planner returned, and
    # the processor's log line for the loop names the same.
    closed = re.search(
        r"the loop planner>budget>planner closed in trace ([0-9a-f]{32}), at span ([0-9a-f]{16}):", out
    )
    assert closed is not None, out
    trace_id, span_id = closed.groups()
    logged = re.findall(r"loop counted: kind=cross_function .*trace_id=(\w+) span_id=(\w+)", out)
    assert logged == [(trace_id, span_id)]
    # Every process it started is gone.
    pids = [int(pid) for pid in re.findall(r", pid (\d+)", out)]
    assert len(pids) == 2
    assert not [pid for pid in pids if psutil.pid_exists(pid)]


def test_demo_stack_without_the_processor_says_what_to_install(run_command: Run) -> None:
    program = (
        "import sys; sys.modules['otel_guard_processor'] = None\n"
        "from otel_guard.cli import main; sys.exit(main(['demo', '--stack']))"
    )
    completed = run_command([sys.executable, "-c", program])
    assert completed.returncode == 1
    assert completed.stderr.count("\n") == 1
    assert "pip install ./processor '.[processor]'" in completed.stderr
