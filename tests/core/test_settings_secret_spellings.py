"""A store URL's secrets are masked whatever their spelling (issue 41.5).

redis-py's ``parse_url`` percent-decodes a query parameter's name before it reads it, so
``?pass%77ord=...`` is the password as surely as ``?password=...``: the settings' ``repr``/``str``, a
settings error and the store's log lines mask it, and every other parameter named like a secret
(``ssl_password``, ``token``, ``auth``...), under any case or layer of escapes.
"""

from __future__ import annotations

import logging
import socket

import pytest
from redis.connection import parse_url

import otel_guard
from otel_guard.budget import probe_store
from otel_guard.settings import redacted_url, settings_from_env

PASSWORD = "hunter2-s3cret"


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        (f"pass%77ord={PASSWORD}", "pass%77ord=***"),
        (f"%70%61%73%73%77%6F%72%64={PASSWORD}", "%70%61%73%73%77%6F%72%64=***"),
        (f"PassWord={PASSWORD}", "PassWord=***"),
        (f"pass%2577ord={PASSWORD}", "pass%2577ord=***"),  # escaped twice
        (f"db=1&pass%77ord={PASSWORD}&socket_timeout=1", "db=1&pass%77ord=***&socket_timeout=1"),
        (f"ssl_password={PASSWORD}", "ssl_password=***"),
        (f"token={PASSWORD}&auth={PASSWORD}&api_key={PASSWORD}", "token=***&auth=***&api_key=***"),
        (f"passwd={PASSWORD}&pwd={PASSWORD}&secret={PASSWORD}", "passwd=***&pwd=***&secret=***"),
        (f"password={PASSWORD}#{PASSWORD}&db=1", "password=***&db=1"),  # a '#' not URL-encoded
        ("db=1&socket_timeout=0.5", "db=1&socket_timeout=0.5"),
    ],
)
def test_a_secret_in_the_query_is_masked_whatever_its_spelling(query: str, shown: str) -> None:
    url = f"redis://cache:6379/0?{query}"
    assert redacted_url(url) == f"redis://cache:6379/0?{shown}"
    assert PASSWORD not in redacted_url(url)


def test_an_escaped_name_is_the_password_redis_reads() -> None:
    """What makes the escaped spelling matter: the client takes it for the password."""
    assert parse_url(f"redis://cache:6379/0?pass%77ord={PASSWORD}")["password"] == PASSWORD  # type: ignore[no-untyped-call]


def test_the_settings_show_no_escaped_password() -> None:
    """Before: ``repr(Settings)`` showed ``?pass%77ord=hunter2-s3cret``."""
    url = f"redis://127.0.0.1:6390/0?pass%77ord={PASSWORD}"
    settings = otel_guard.configure(budget_store=url)
    for text in (repr(settings), str(settings), f"{settings}", f"{settings!r}"):
        assert PASSWORD not in text, text
        assert "budget_store='redis://127.0.0.1:6390/0?pass%77ord=***'" in text
    assert settings.budget_store == url  # the store gets the real URL
    from_env = settings_from_env(
        {"OTEL_GUARD_BUDGET_STORE": f"redis://:{PASSWORD}@c:1/0?%70assword={PASSWORD}"}
    )
    assert PASSWORD not in repr(from_env)


def test_a_settings_error_shows_no_escaped_password() -> None:
    value = f"redis://cache:6379/0?pass%77ord={PASSWORD}&socket_timeout=soon"
    with pytest.raises(ValueError, match="Invalid value for 'socket_timeout'") as err:
        settings_from_env({"OTEL_GUARD_BUDGET_STORE": value})
    assert PASSWORD not in str(err.value)
    assert "pass%77ord=***" in str(err.value)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_stores_warning_shows_no_escaped_password(caplog: pytest.LogCaptureFixture) -> None:
    """The store's line about a Redis it cannot reach names the URL, masked."""
    url = f"redis://127.0.0.1:{closed_port()}/0?pass%77ord={PASSWORD}"
    settings = otel_guard.configure(max_hops=5, budget_store=url)
    with caplog.at_level(logging.INFO, logger="otel_guard"):
        probe_store(settings)
    assert "cannot be reached (ConnectionError" in caplog.text
    assert "/0?pass%77ord=***" in caplog.text
    assert PASSWORD not in caplog.text
