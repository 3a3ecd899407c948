"""A silent store speaks up (issue 22.4): a Redis that cannot be reached is a warning, not a shrug.

With ``budget_on_error=allow`` (the default) a Redis that is down turns budgets off: the guard says
so, on the ``otel_guard`` logger, once where it starts (or at its first hop), and once when a store
that answered stops answering, at most once a minute; an info line when it answers again. Never with
the URL's password, nor a key's secret.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis_server import RedisServer, free_port
from test_settings_secrets import PASSWORD, SECRET, assert_no_secret

import otel_guard
import otel_guard.budget.redis_store
from otel_guard import DelegationRefused, delegate
from otel_guard._start import settings_at_start
from otel_guard.budget import HOPS, Meter, StoreError
from otel_guard.budget.redis_store import RedisStore

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def store_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(level, message) of every line the guard logged about its budget store."""
    return [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.name == "otel_guard" and "budget store" in record.getMessage()
    ]


def nothing_listens() -> tuple[int, str]:
    port = free_port()  # bound and closed at once: nothing listens on it
    return port, f"redis://user:{PASSWORD}@127.0.0.1:{port}/0"


def hops(count: int) -> list[str]:
    """``count`` hops, each the first of a tree; each one's decision (or reason, when refused)."""
    seen = []
    for _ in range(count):
        try:
            with delegate("planner") as hop:
                seen.append(hop.decision or "")
        except DelegationRefused as err:
            seen.append(err.reason)
    return seen


@pytest.mark.parametrize(
    ("on_error", "then"),
    [("allow", "hops will be allowed uncounted"), ("refuse", "hops will be refused (reason budget)")],
)
def test_a_store_that_cannot_be_reached_at_start_up_is_one_warning(
    caplog: pytest.LogCaptureFixture, on_error: str, then: str
) -> None:
    port, url = nothing_listens()
    otel_guard.configure(budget_store=url, budget_on_error=on_error, keys={"k1": SECRET})
    caplog.set_level(logging.INFO, logger="otel_guard")
    started = time.monotonic()
    settings_at_start()
    assert time.monotonic() - started < 1.0  # within the store's timeout (0.25 s)
    [(level, line)] = store_lines(caplog)
    assert level == "WARNING"
    shown = f"redis://user:***@127.0.0.1:{port}/0"
    assert line.startswith(f"otel-guard: the budget store {shown} cannot be reached (ConnectionError: ")
    assert line.endswith(f"; budget_on_error is {on_error}: {then} until it answers")
    assert_no_secret(line)
    settings_at_start()  # another instrumentor starts: the store is not asked again
    assert hops(100) == (["allow"] * 100 if on_error == "allow" else ["budget"] * 100)
    assert len(store_lines(caplog)) == 1


def test_the_first_hop_warns_when_nothing_asked_at_start_up(caplog: pytest.LogCaptureFixture) -> None:
    port, url = nothing_listens()
    otel_guard.configure(budget_store=url, keys={"k1": SECRET})
    assert hops(100) == ["allow"] * 100
    [(level, line)] = store_lines(caplog)
    assert level == "WARNING"
    assert f"redis://user:***@127.0.0.1:{port}/0 cannot be reached" in line
    assert_no_secret(line)


def test_an_instrumentor_starting_with_the_store_down_says_so_in_one_line(
    run_command: Callable[..., Any],
) -> None:
    port, url = nothing_listens()
    program = (
        "from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor\n"
        "PydanticAIInstrumentor().instrument()\n"
        "print('the app ran')\n"
    )
    completed = run_command(
        [sys.executable, "-c", program], OTEL_GUARD_BUDGET_STORE=url, OTEL_TRACES_EXPORTER="none"
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == "the app ran\n"
    [line] = completed.stderr.splitlines()  # Python's last-resort handler: the message alone
    assert line.startswith(f"otel-guard: the budget store redis://user:***@127.0.0.1:{port}/0 cannot be")
    assert "budget_on_error is allow: hops will be allowed uncounted until it answers" in line
    assert_no_secret(completed.stderr)


def test_a_store_url_that_does_not_parse_stops_the_program_naming_the_setting(
    run_command: Callable[..., Any],
) -> None:
    program = (
        "from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor\n"
        "PydanticAIInstrumentor().instrument()\n"
        "print('the app ran')\n"
    )
    url = f"redis://:{PASSWORD}@cache:port/0"
    completed = run_command([sys.executable, "-c", program], OTEL_GUARD_BUDGET_STORE=url)
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr == (
        "otel-guard: OTEL_GUARD_BUDGET_STORE: budget_store: 'redis://:***@cache:port/0' is not 'memory' or a "
        "Redis URL (redis://host:6379/0, rediss://..., unix:///path)\n"
    )
    assert completed.stdout == ""


def test_a_healthy_store_at_start_up_says_nothing(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    otel_guard.configure(budget_store=redis_server.url)
    caplog.set_level(logging.INFO, logger="otel_guard")
    settings_at_start()
    with delegate("planner") as hop:
        pass
    assert hop.span.attributes is not None
    assert hop.span.attributes["otel_guard.budget.hops"] == 1
    assert store_lines(caplog) == []


def test_a_store_that_stops_answering_warns_once_not_once_a_hop(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No pause after a failure: every one of the 100 hops asks the Redis that is gone.
    monkeypatch.setattr(otel_guard.budget.redis_store, "DOWN_FOR", 0.0)
    client = redis_server.client()
    client.config_set("requirepass", PASSWORD)  # the Redis wants a password, which the URL gives
    client.close()
    otel_guard.configure(budget_store=redis_server.url.replace("redis://", f"redis://:{PASSWORD}@"))
    caplog.set_level(logging.INFO, logger="otel_guard")
    settings_at_start()
    assert hops(3) == ["allow"] * 3
    assert store_lines(caplog) == []
    redis_server.stop()
    assert hops(100) == ["allow"] * 100
    [(level, line)] = store_lines(caplog)
    assert level == "WARNING"
    assert line.startswith(
        f"otel-guard: the budget store redis://:***@127.0.0.1:{redis_server.port}/0 stopped"
    )
    assert_no_secret(line)


def test_a_store_that_comes_and_goes_warns_at_most_once_a_period(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    store = RedisStore(redis_server.url, down_for=1.0, warn_every=60.0, clock=lambda: now[0])
    meter = Meter("tree:ws:a", 0, time.time() + 600, HOPS)
    caplog.set_level(logging.INFO, logger="otel_guard")

    def take_until_answered() -> None:
        for _ in range(10):  # the first take after a restart may meet the connection Redis closed
            now[0] += 1.5  # past the pause after a failure
            try:
                store.take([meter], time.time())
                return
            except StoreError:
                pass
        raise AssertionError("the store never answered again")

    def outage(seconds: float) -> None:
        redis_server.stop()
        for _ in range(50):
            with pytest.raises(StoreError):
                store.take([meter], time.time())
            now[0] += seconds / 50
        redis_server.start()
        take_until_answered()

    store.take([meter], time.time())
    outage(5.0)  # the first: told, and its end
    now[0] += 10.0
    outage(5.0)  # 20 s after the first warning: not told, nor its end
    now[0] += 60.0
    outage(5.0)  # past the period: told again
    store.close()
    name = f"redis://127.0.0.1:{redis_server.port}/0"
    assert [(level, line.split(" (")[0]) for level, line in store_lines(caplog)] == [
        ("WARNING", f"otel-guard: the budget store {name} stopped answering"),
        ("INFO", f"otel-guard: the budget store {name} answers again; hops are counted"),
        ("WARNING", f"otel-guard: the budget store {name} stopped answering"),
        ("INFO", f"otel-guard: the budget store {name} answers again; hops are counted"),
    ]
