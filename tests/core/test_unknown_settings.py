"""An ``OTEL_GUARD_*`` variable that names no setting is a warning at start, once, with the closest
setting's variable (docs/settings.md): never silence, never an error.

The warning is once a process, so each case runs in a fresh interpreter with logging left
unconfigured (Python's last-resort handler writes it to stderr), as a deployed program would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_guard.settings import ENV, NOT_SETTINGS, unknown_variables

BIN = Path(sys.executable).parent
Run = Callable[..., Any]
TTL_LINE = "otel-guard: OTEL_GUARD_TTL names no setting and is ignored; did you mean OTEL_GUARD_TTL_SECONDS?"


@pytest.mark.parametrize(
    ("variable", "closest"),
    [
        ("OTEL_GUARD_TTL", "OTEL_GUARD_TTL_SECONDS"),  # the name the docs gave
        ("OTEL_GUARD_MAX_DEPHT", "OTEL_GUARD_MAX_DEPTH"),
        ("OTEL_GUARD_KEY", "OTEL_GUARD_KEYS"),
        ("OTEL_GUARD_EXCLUDE_URLS", "OTEL_GUARD_EXCLUDED_URLS"),
        ("OTEL_GUARD_WORKSPACE_WINDOW", "OTEL_GUARD_WORKSPACE_WINDOW_SECONDS"),
        ("OTEL_GUARD_ACCEPT_UNSIGNED_CHAINS", "OTEL_GUARD_ACCEPT_UNSIGNED"),
        ("otel_guard_mode", "OTEL_GUARD_MODE"),
        ("OTEL_GUARD_LOG_LEVEL", None),
    ],
)
def test_the_closest_setting_is_named(variable: str, closest: str | None) -> None:
    assert unknown_variables({variable: "x", "OTEL_GUARD_MODE": "observe"}) == [(variable, closest)]


def test_settings_and_the_processors_variables_are_no_mistake() -> None:
    environ = dict.fromkeys(ENV.values(), "x")
    environ.update(
        {"OTEL_GUARD_PROCESSOR_FORWARD": "off", "OTEL_GUARD_PROCESSOR_MAX_SPANS": "1", "PATH": "/"}
    )
    assert unknown_variables(environ) == []
    assert NOT_SETTINGS == ("OTEL_GUARD_PROCESSOR_",)


def test_the_processors_options_are_all_under_its_prefix() -> None:
    config = pytest.importorskip("otel_guard_processor.config")
    assert {option.env for option in config.OPTIONS}
    assert all(option.env.startswith(NOT_SETTINGS) for option in config.OPTIONS)


def warnings_in(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "names no setting" in line]


@pytest.mark.integration
def test_under_opentelemetry_instrument_each_unknown_name_is_warned_of_once(run_command: Run) -> None:
    argv = [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", "print('the app ran')"]
    completed = run_command(
        argv,
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_GUARD_TTL="60",
        OTEL_GUARD_BOGUS="1",
        OTEL_GUARD_PROCESSOR_FORWARD="off",
        OTEL_GUARD_KEYS="k1:" + "A" * 43,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "the app ran\n"
    assert warnings_in(completed.stderr) == [
        "otel-guard: OTEL_GUARD_BOGUS names no setting and is ignored; no setting's variable is close to it",
        TTL_LINE,
    ]


PROGRAM = """
import otel_guard
print(otel_guard.configure(mode="observe").ttl)
with otel_guard.delegate("planner"):
    pass
otel_guard.configure(max_depth=4)
print("done")
"""


@pytest.mark.integration
def test_the_first_configure_warns_once(run_command: Run) -> None:
    completed = run_command(
        [sys.executable, "-c", PROGRAM], OTEL_GUARD_TTL="60", OTEL_GUARD_KEYS="k1:" + "A" * 43
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "300.0\ndone\n"  # the misspelt ttl is not read: the default stands
    assert warnings_in(completed.stderr) == [TTL_LINE]


@pytest.mark.integration
def test_the_first_hop_warns_where_nothing_started_the_guard(run_command: Run) -> None:
    program = "import otel_guard\nwith otel_guard.delegate('planner'):\n    pass\n"
    completed = run_command([sys.executable, "-c", program], OTEL_GUARD_TTL="60")
    assert completed.returncode == 0, completed.stderr
    assert warnings_in(completed.stderr) == [TTL_LINE]


@pytest.mark.integration
def test_no_warning_where_the_environment_is_not_read(run_command: Run) -> None:
    """configure() with every setting given reads no variable (the demo): nothing to warn of."""
    completed = run_command([str(BIN / "otel-guard"), "demo"], timeout=60, OTEL_GUARD_TTL="60")
    assert completed.returncode == 0, completed.stderr
    assert warnings_in(completed.stderr) == []


@pytest.mark.integration
def test_no_warning_without_unknown_names(run_command: Run) -> None:
    program = "import otel_guard\notel_guard.configure(mode='observe')\n"
    completed = run_command(
        [sys.executable, "-c", program], OTEL_GUARD_MODE="enforce", OTEL_GUARD_KEYS="k1:" + "A" * 43
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
