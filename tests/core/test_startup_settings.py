"""A bad ``OTEL_GUARD_*`` value is found where the guard starts (docs/spec.md §2).

Wherever the guard starts -- an instrumentor under ``opentelemetry-instrument`` or in code, the ASGI
middleware of a server, the CLI -- the program ends there with one line on stderr that names the
variable and what it accepts, and exit status 2: never a traceback, never a server that starts and
then answers every request with 500. What never reads the environment (the demo) runs regardless.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_guard import settings as policy_settings

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
BAD = {"OTEL_GUARD_MODE": "bogus"}
ONE_LINE = "otel-guard: OTEL_GUARD_MODE: mode: 'bogus' is not one of enforce, observe, off\n"
ASGI_APP = """
from starlette.applications import Starlette
from otel_guard.asgi import GuardMiddleware

app = GuardMiddleware(Starlette(), agent="budget")
"""

Run = Callable[..., Any]


def assert_stopped_in_one_line(completed: Any) -> None:
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr == ONE_LINE
    assert "the app ran" not in completed.stdout


def test_under_opentelemetry_instrument_a_bad_setting_stops_the_program(run_command: Run) -> None:
    argv = [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", "print('the app ran')"]
    completed = run_command(argv, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", **BAD)
    assert_stopped_in_one_line(completed)


def test_an_instrumentor_in_code_stops_the_program(run_command: Run) -> None:
    program = (
        "from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor\n"
        "PydanticAIInstrumentor().instrument()\n"
        "print('the app ran')\n"
    )
    assert_stopped_in_one_line(run_command([sys.executable, "-c", program], **BAD))


def test_an_asgi_server_with_a_bad_setting_never_starts(run_command: Run, tmp_path: Path) -> None:
    (tmp_path / "guarded_app.py").write_text(ASGI_APP, encoding="utf-8")
    argv = [str(BIN / "uvicorn"), "--app-dir", str(tmp_path), "guarded_app:app", "--port", "0"]
    completed = run_command(argv, timeout=30, **BAD)
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr == ONE_LINE  # and no "Application startup complete"


def test_the_demo_runs_whatever_the_environment_says(run_command: Run) -> None:
    completed = run_command([str(BIN / "otel-guard"), "demo"], timeout=60, **BAD)
    assert completed.returncode == 0, completed.stderr
    assert "refused (cycle)" in completed.stdout


def test_configure_with_every_setting_given_does_not_read_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_GUARD_MAX_DEPTH", "not a number")
    monkeypatch.setattr(policy_settings, "_current", None)
    every = {name: getattr(policy_settings.Settings(), name) for name in policy_settings.ENV}
    settings = policy_settings.configure(**{**every, "max_depth": 3})
    assert settings.max_depth == 3
    monkeypatch.setattr(policy_settings, "_current", None)
    with pytest.raises(ValueError, match="OTEL_GUARD_MAX_DEPTH"):
        policy_settings.configure(max_depth=3)  # the other settings come from the environment: it is read
