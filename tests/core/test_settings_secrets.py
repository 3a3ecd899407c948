"""Settings print no secret (issue 23.6): a store URL's password and a key's secret never show.

``repr`` and ``str`` of the settings (what ``configure()`` returns), a settings error about a bad
``budget_store``, and the guard's lines about the store show ``redis://user:***@host:6379/0``; the
store itself still gets the real URL.
"""

from __future__ import annotations

import base64
import os

import pytest

import otel_guard
from otel_guard.settings import Settings, redacted_url, settings_from_env

PASSWORD = "hunter2-s3cret"
SECRET = os.urandom(32)
SECRET_TEXTS = (
    PASSWORD,
    base64.urlsafe_b64encode(SECRET).decode().rstrip("="),
    repr(SECRET),
    SECRET.hex(),
)


def assert_no_secret(text: str) -> None:
    for secret in SECRET_TEXTS:
        assert secret not in text, text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://user:{PASSWORD}@cache:6379/0", "redis://user:***@cache:6379/0"),
        (f"redis://:{PASSWORD}@cache:6379/0", "redis://:***@cache:6379/0"),
        (f"rediss://{PASSWORD}@cache:6380/1", "rediss://***@cache:6380/1"),  # a lone user part too
        (f"redis://:p@ss/{PASSWORD}@cache:6379", "redis://:***@cache:6379"),  # not URL-encoded
        (f"unix://:{PASSWORD}@/run/redis.sock?db=2", "unix://:***@/run/redis.sock?db=2"),
        (f"redis://cache:6379/0?db=1&password={PASSWORD}", "redis://cache:6379/0?db=1&password=***"),
        (f"redis//:{PASSWORD}@cache:6379", "***@cache:6379"),  # not even a URL
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("memory", "memory"),
    ],
)
def test_a_store_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redacted_url(url) == shown


def test_the_settings_configure_returns_show_no_secret() -> None:
    url = f"redis://user:{PASSWORD}@127.0.0.1:6390/0"
    settings = otel_guard.configure(budget_store=url, keys={"k1": SECRET})
    for text in (repr(settings), str(settings), f"{settings}", f"{settings!r}"):
        assert_no_secret(text)
        assert "budget_store='redis://user:***@127.0.0.1:6390/0'" in text
        assert "keys=<Keyring k1>" in text
        assert text.startswith("Settings(mode='enforce', ")
    assert settings.budget_store == url  # the store gets the real URL
    assert repr(Settings()) == repr(Settings())  # every field shown, defaults included
    assert "budget_store='memory'" in repr(Settings())


def test_settings_from_the_environment_show_no_secret() -> None:
    key = base64.urlsafe_b64encode(SECRET).decode().rstrip("=")
    settings = settings_from_env(
        {
            "OTEL_GUARD_BUDGET_STORE": f"redis://:{PASSWORD}@cache:6379/0",
            "OTEL_GUARD_KEYS": f"k1:{key},k2:{key}",
        }
    )
    assert_no_secret(repr(settings))
    assert "keys=<Keyring k1, k2>" in repr(settings)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (
            f"memcached://user:{PASSWORD}@cache:11211",
            "'memcached://user:***@cache:11211' is not 'memory' or a",
        ),
        (f"redis://:{PASSWORD}@cache:port", "'redis://:***@cache:port' is not 'memory' or a Redis URL"),
        (
            f"redis://:{PASSWORD}@cache:6379/zero",
            "'redis://:***@cache:6379/zero': the database is not a number",
        ),
        (
            f"redis://:{PASSWORD}@cache:6379/0?socket_timeout=soon",
            "'redis://:***@cache:6379/0?socket_timeout=soon': Invalid value for 'socket_timeout'",
        ),
        (f"redis//:{PASSWORD}@cache:6379", "'***@cache:6379' is not 'memory' or a Redis URL"),
    ],
)
def test_a_bad_store_url_is_named_without_its_password(value: str, says: str) -> None:
    with pytest.raises(ValueError, match="budget_store") as from_env:
        settings_from_env({"OTEL_GUARD_BUDGET_STORE": value})
    assert str(from_env.value).startswith("OTEL_GUARD_BUDGET_STORE: budget_store: ")
    assert says in str(from_env.value)
    assert_no_secret(str(from_env.value))
    with pytest.raises(ValueError, match="budget_store") as from_configure:
        otel_guard.configure(budget_store=value)
    assert says in str(from_configure.value)
    assert_no_secret(str(from_configure.value))


def test_a_scheme_in_capitals_is_taken_as_redis_takes_it() -> None:
    """Redis's client reads only lower-case schemes: the setting keeps the URL it can use."""
    assert settings_from_env({"OTEL_GUARD_BUDGET_STORE": "REDIS://cache:6379/2"}).budget_store == (
        "redis://cache:6379/2"
    )


def test_a_keys_item_without_its_key_id_is_not_repeated() -> None:
    """A bare secret pasted into OTEL_GUARD_KEYS (its ``kid:`` forgotten) is not echoed in the error."""
    secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"
    with pytest.raises(
        ValueError, match="OTEL_GUARD_KEYS: keys: item 2 is not of the form kid:secret"
    ) as err:
        settings_from_env({"OTEL_GUARD_KEYS": f"k1:{'A' * 43},{secret}"})
    assert secret not in str(err.value)
