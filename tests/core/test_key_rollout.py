"""Keys rolled out to a fleet of services over HTTP (docs/security.md, "Rolling keys out").

The services are fresh interpreters (``programs/rollout_service.py``: GuardMiddleware under uvicorn on
127.0.0.1) configured only by ``OTEL_GUARD_*`` variables, as deployed services are; the caller is this
process. The finding: a service given keys before its callers refuses every call into it, in observe
mode too. With ``accept_unsigned`` it takes them as would-refuses, so the order (verifiers first with
``accept_unsigned``, then signers, then ``accept_unsigned`` off) refuses no healthy call at any step,
and a forged or altered token is refused at every step by every service that has keys.
"""

from __future__ import annotations

import base64
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import propagate
from ports import free_port

import otel_guard
from otel_guard import delegate
from otel_guard.chain import Chain, Hop, Keyring, encode, new_root

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).parent / "programs" / "rollout_service.py"
START_SECONDS = 30.0
FLEET_SECRET = b"f" * 32
FLEET_KEYS = "k1:" + base64.urlsafe_b64encode(FLEET_SECRET).rstrip(b"=").decode("ascii")
FORGER = Keyring({"k1": b"x" * 32})
Call = Callable[..., tuple[int, dict[str, Any]]]


@contextmanager
def services(*specs: tuple[str, dict[str, str]]) -> Iterator[list[str]]:
    """Start a pipeline of services, each ``(agent, environment)``, each calling the next; yields
    their URLs, first to last, and stops them all when the block ends."""
    ports = [free_port() for _ in specs]
    urls = [f"http://127.0.0.1:{port}/" for port in ports]
    with ExitStack() as stack:
        started = []
        for index, (agent, settings) in enumerate(specs):
            argv = [sys.executable, str(SERVICE), str(ports[index]), agent]
            if index + 1 < len(specs):
                argv.append(urls[index + 1])
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **settings}
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
            )
            stack.callback(_stop, process)
            started.append(process)
        for process in started:  # they start side by side; each is waited for in turn
            _wait_ready(process)
        yield urls


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.1)
        if ready:
            line = process.stdout.readline()
            assert line.strip() == "READY", (line, process.stderr.read() if process.stderr else "")
            return
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
    raise AssertionError("the service did not start")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def call(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    """A healthy call from this process (the hop ``planner``, its chain injected), or a request
    carrying ``token`` as its chain."""
    if token is not None:
        reply = httpx.post(url, headers={"baggage": f"otel_guard.chain={token}"}, timeout=30)
    else:
        with delegate("planner"):
            headers: dict[str, str] = {}
            propagate.inject(headers)
            reply = httpx.post(url, headers=headers, timeout=30)
    return reply.status_code, reply.json()


def chain_of(*agents: str) -> Chain:
    now = time.time()
    return Chain(tuple(Hop(agent) for agent in agents), new_root(), "default", now, now + 300)


def bad_tokens() -> dict[str, str]:
    """Tokens a service with the fleet's keys refuses whatever its settings: forged, altered."""
    signed = encode(chain_of("planner"), Keyring({"k1": FLEET_SECRET}))
    header, _, signature = signed.split(".")
    trimmed = encode(chain_of("budget"), None).split(".")[1]  # other claims under planner's signature
    return {
        "forged (another secret)": encode(chain_of("planner"), FORGER),
        "forged (unknown key id)": encode(chain_of("planner"), Keyring({"evil": b"x" * 32})),
        "altered": f"{header}.{trimmed}.{signature}",
        "signature stripped": f"{header}.{signed.split('.')[1]}.",
    }


def assert_bad_tokens_refused(url: str) -> None:
    for what, token in bad_tokens().items():
        status, body = call(url, token)
        assert (status, body.get("reason")) == (409, "bad_signature"), what


WITH_KEYS = {"OTEL_GUARD_KEYS": FLEET_KEYS}
ACCEPTING = {**WITH_KEYS, "OTEL_GUARD_ACCEPT_UNSIGNED": "true"}


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_keys_added_to_a_service_before_its_callers_refuse_every_call(mode: str) -> None:
    """The finding, and what accept_unsigned makes of it: this process holds no keys."""
    otel_guard.configure(keys=None)
    with services(("budget", {**WITH_KEYS, "OTEL_GUARD_MODE": mode})) as (budget,):
        status, body = call(budget)
        assert status == 409, body
        assert body["reason"] == "bad_signature"
        assert "unsigned" in body["message"]
    with services(("budget", {**ACCEPTING, "OTEL_GUARD_MODE": mode})) as (budget,):
        status, body = call(budget)
        assert status == 200, body
        assert (body["decision"], body["reason"]) == ("would_refuse", "bad_signature")
        assert body["events"] == ["otel_guard.would_refuse"]
        assert body["chain"] == ["planner", "budget"]  # the caller's chain, as it arrived
        assert_bad_tokens_refused(budget)


def test_the_rollout_order_refuses_no_healthy_call_and_every_bad_token() -> None:
    """planner (this process) → budget → fx, keys rolled out in the documented order."""

    def healthy(urls: list[str]) -> list[tuple[str | None, str | None]]:
        status, body = call(urls[0])
        assert status == 200, body
        assert body["next"]["status"] == 200, body
        fx = body["next"]["body"]
        assert fx["chain"] == ["planner", "budget", "fx"]
        assert fx["root"] == body["root"]  # one tree through every step
        return [(body["decision"], body["reason"]), (fx["decision"], fx["reason"])]

    allow = ("allow", None)
    unsigned = ("would_refuse", "bad_signature")

    otel_guard.configure(keys=None)
    with services(("budget", {}), ("fx", {})) as urls:  # before: no keys anywhere
        assert healthy(urls) == [allow, allow]
    with services(("budget", {}), ("fx", ACCEPTING)) as urls:  # 1. a verifier (fx) first ...
        assert healthy(urls) == [allow, unsigned]
        assert_bad_tokens_refused(urls[1])
    with services(("budget", ACCEPTING), ("fx", ACCEPTING)) as urls:  # ... then the other
        assert healthy(urls) == [unsigned, allow]  # budget signs what it sends on
        otel_guard.configure(keys=FLEET_KEYS)  # 2. then the signers
        assert healthy(urls) == [allow, allow]
        for url in urls:
            assert_bad_tokens_refused(url)
    with services(("budget", WITH_KEYS), ("fx", WITH_KEYS)) as urls:  # 3. accept_unsigned off
        assert healthy(urls) == [allow, allow]
        for url in urls:
            assert_bad_tokens_refused(url)
            status, body = call(url, encode(chain_of("planner"), None))
            assert (status, body["reason"]) == (409, "bad_signature")
