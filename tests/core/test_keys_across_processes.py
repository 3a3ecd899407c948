"""Per-service keys across processes over HTTP (docs/security.md, "Per-service keys").

Each service is a fresh interpreter (``programs/rollout_service.py``: GuardMiddleware under uvicorn on
127.0.0.1) configured only by ``OTEL_GUARD_KEYS`` (its own private key) and ``OTEL_GUARD_JWKS`` (the
fleet's public keys), the chain travelling in the W3C ``baggage`` header. The partner service holds
the JWKS only: it verifies every chain and signs none, so what it sends on is the chain as it arrived.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fresh_environment import clean_environment
from test_key_rollout import SERVICE, _stop, _wait_ready, call, free_port, services

import otel_guard
from otel_guard.chain import generate_key_pair

pytestmark = pytest.mark.integration


class Fleet:
    """Three services' key pairs (two Ed25519, one P-256) and the one JWKS file of their public keys."""

    def __init__(self, directory: Path) -> None:
        self.env: dict[str, str] = {}
        jwks = []
        for name, alg in (("caller", "ed25519"), ("budget", "ed25519"), ("fx", "es256")):
            kid, private, jwk = generate_key_pair(alg, f"{name}-2026")
            self.env[name] = f"{kid}:{private}"
            jwks.append(jwk)
        self.jwks = directory / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": jwks}), encoding="utf-8")

    def signer(self, name: str) -> dict[str, str]:
        return {"OTEL_GUARD_KEYS": self.env[name], "OTEL_GUARD_JWKS": str(self.jwks)}

    def verifier(self) -> dict[str, str]:
        return {"OTEL_GUARD_JWKS": str(self.jwks)}


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    keys = Fleet(tmp_path)
    otel_guard.configure(keys=keys.env["caller"], jwks=str(keys.jwks))  # this process: the caller
    return keys


def test_a_verify_only_service_verifies_signed_chains_and_sends_them_on_as_they_arrived(fleet: Fleet) -> None:
    with services(
        ("budget", fleet.signer("budget")), ("partner", fleet.verifier()), ("fx", fleet.signer("fx"))
    ) as (
        budget,
        _,
        _,
    ):
        status, answer = call(budget)
    assert status == 200, answer
    partner = answer["next"]["body"]
    fx = partner["next"]["body"]
    assert (answer["decision"], answer["chain"]) == ("allow", ["planner", "budget"])
    # The partner verified the chain budget signed with its Ed25519 key, and ran its hop in it.
    assert (partner["decision"], partner["chain"]) == ("allow", ["planner", "budget", "partner"])
    # fx verified what the partner sent with budget's public key: the chain as it left budget. The
    # partner's hop is not in it: it has no key to sign a chain that holds it.
    assert (fx["decision"], fx["chain"]) == ("allow", ["planner", "budget", "fx"])
    assert answer["root"] == partner["root"] == fx["root"]  # one tree across the four processes


def test_a_loop_through_a_verify_only_service_is_stopped(fleet: Fleet) -> None:
    """Further on, a cycle; straight back to the service that sent the chain in, a replay that the
    tree's hop budget stops (the partner sends on the very chain that service received)."""
    with services(
        ("budget", fleet.signer("budget")),
        ("partner", fleet.verifier()),
        ("fx", fleet.signer("fx")),
        ("budget", fleet.signer("budget")),
    ) as (budget, *_):
        status, answer = call(budget)
    assert status == 200, answer
    partner = answer["next"]["body"]
    fx = partner["next"]["body"]
    assert fx["next"]["status"] == 409  # budget -> partner -> fx -> budget: a cycle
    assert fx["next"]["body"]["reason"] == "cycle"

    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}/" for port in ports]
    ring = [  # budget -> partner -> budget -> ...: one budget service, counting in its own store
        ("budget", {**fleet.signer("budget"), "OTEL_GUARD_MAX_HOPS": "4"}, urls[1]),
        ("partner", fleet.verifier(), urls[0]),
    ]
    with ExitStack() as stack:
        for (agent, env, next_url), port in zip(ring, ports, strict=True):
            argv = [sys.executable, str(SERVICE), str(port), agent, next_url]
            process = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_environment(**env)
            )
            stack.callback(_stop, process)
            _wait_ready(process)
        status, answer = call(urls[0])
    depth = 0
    while "next" in answer and answer["next"]["status"] == 200:
        answer = answer["next"]["body"]
        depth += 1
    assert answer["agent"] == "partner"
    assert answer["next"]["status"] == 409
    assert answer["next"]["body"]["reason"] == "budget"
    assert depth < 10


def test_a_verify_only_service_refuses_forged_and_unsigned_chains(fleet: Fleet) -> None:
    from test_key_rollout import chain_of

    from otel_guard.chain import Keyring, encode

    impostor = Keyring.parse(generate_key_pair("ed25519", "budget-2026")[1].join(["budget-2026:", ""]))
    with services(("partner", fleet.verifier())) as (partner,):
        for token in (encode(chain_of("planner"), None), encode(chain_of("planner"), impostor)):
            status, body = call(partner, token)
            assert (status, body.get("reason")) == (409, "bad_signature")
        status, body = call(partner)  # the caller's own key: its public key is in the JWKS
        assert (status, body["chain"]) == (200, ["planner", "partner"])


MINT = """
import json, sys, time
from otel_guard.chain import ChainToken, Chain, Hop, NoSigningKey, encode, new_root
from otel_guard.settings import current_settings
keys = current_settings().keys
now = time.time()
chain = Chain((Hop("partner"),), new_root(), "default", now, now + 300)
token = ChainToken(chain, keys)
try:
    encode(chain, keys)
    outcome = "minted"
except NoSigningKey as exc:
    outcome = "refused: " + str(exc)
print(json.dumps({"signing": keys.signing is not None, "travels": token.travels, "outcome": outcome}))
"""


def test_a_process_with_public_keys_only_cannot_mint(fleet: Fleet, run_command: Callable[..., Any]) -> None:
    completed = run_command([sys.executable, "-c", MINT], **fleet.verifier())
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["signing"] is False
    assert result["travels"] is False
    assert result["outcome"].startswith("refused: otel-guard: this process holds public keys only")
