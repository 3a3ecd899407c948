"""Fixtures for the core guard's tests: keys, a chain placed in the context's baggage, subprograms.

The session-wide SDK (spans, metrics) and the settings reset after each test come from
``tests/conftest.py``; this file only adds what the core tests share.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
from fresh_environment import clean_environment
from opentelemetry import baggage, context

import otel_guard
from otel_guard.chain import Keyring

PROGRAMS = Path(__file__).parent / "programs"
REPO = Path(__file__).resolve().parents[2]
CHAIN_KEY = "otel_guard.chain"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Key:
    """One signing key: its id, its secret, and the ``OTEL_GUARD_KEYS`` form of it."""

    def __init__(self, kid: str, secret: bytes) -> None:
        self.kid = kid
        self.secret = secret

    @property
    def env(self) -> str:
        return f"{self.kid}:{b64(self.secret)}"

    def keyring(self) -> Keyring:
        return Keyring({self.kid: self.secret})


@pytest.fixture
def make_key() -> Callable[[str], Key]:
    """A fresh random key with the given id."""
    return lambda kid: Key(kid, os.urandom(32))


@pytest.fixture
def key(make_key: Callable[[str], Key]) -> Key:
    """A key configured for the test: chains are signed and verified with it."""
    k = make_key("k1")
    otel_guard.configure(keys={k.kid: k.secret})
    return k


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Any]:
    """A real ``redis-server`` on 127.0.0.1 for the test (its ``url``), stopped after it."""
    from redis_server import running_redis

    with running_redis(tmp_path) as server:
        yield server


@pytest.fixture
def unique() -> Callable[[str], str]:
    """A name no other test in the session uses (metrics are cumulative for the session)."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:10]}"


@contextmanager
def _chain_in_baggage(value: object) -> Iterator[None]:
    token = context.attach(baggage.set_baggage(CHAIN_KEY, value))
    try:
        yield
    finally:
        context.detach(token)


@pytest.fixture
def chain_in_baggage() -> Callable[[object], AbstractContextManager[None]]:
    """Run a block with ``value`` as the ``otel_guard.chain`` baggage member, as a carrier would."""
    return _chain_in_baggage


def token_from_carrier(carrier: dict[str, str]) -> str:
    """The chain token in a carrier the W3C baggage propagator wrote."""
    for member in carrier["baggage"].split(","):
        name, _, value = member.partition("=")
        if name.strip() == CHAIN_KEY:
            return value.strip()
    raise AssertionError(f"no {CHAIN_KEY} member in {carrier!r}")


@pytest.fixture
def carrier_token() -> Callable[[dict[str, str]], str]:
    return token_from_carrier


def _run(
    argv: list[str], stdin: str = "", *, timeout: float = 60, **settings: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env=clean_environment(**settings),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def run_command() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``argv`` in a clean environment (keyword arguments become environment variables)."""
    return _run


def _run_program(name: str, payload: Any = None, *, timeout: float = 60, **settings: str) -> Any:
    completed = _run([sys.executable, str(PROGRAMS / name)], json.dumps(payload), timeout=timeout, **settings)
    assert completed.returncode == 0, f"{name} failed ({completed.returncode}):\n{completed.stderr}"
    return json.loads(completed.stdout)


@pytest.fixture
def run_program() -> Callable[..., Any]:
    """Run ``tests/core/programs/NAME`` in a fresh interpreter: JSON in on stdin, JSON out on stdout.

    Keyword arguments become environment variables (``OTEL_GUARD_KEYS="..."``).
    """
    return _run_program
