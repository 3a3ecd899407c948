"""EdDSA and ES256 chain tokens against other JOSE implementations: PyJWT, and Node's ``jose``.

Each verifies the guard's tokens with the public JWK ``otel-guard keygen`` prints, and the guard
verifies theirs (signed with the private JWK) through a JWKS of the public one. ``jose`` is installed
by scripts/bootstrap with npm in tests/core/jose (its package.json).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from otel_guard._jwk import PublicKeys
from otel_guard.chain import Chain, Hop, Keyring, decode, encode, generate_key_pair, new_root

ALGS = ["ed25519", "es256"]
NODE = shutil.which("node")
JOSE_MODULES = Path(__file__).parent / "jose" / "node_modules"

JOSE_SCRIPT = """
import * as jose from "jose";
let input = "";
for await (const chunk of process.stdin) input += chunk;
const job = JSON.parse(input);
if (job.mode === "verify") {
  const key = await jose.importJWK(job.jwk, job.jwk.alg);
  const { payload, protectedHeader } = await jose.jwtVerify(job.token, key, { algorithms: [job.jwk.alg] });
  console.log(JSON.stringify({ payload, protectedHeader }));
} else {
  const key = await jose.importJWK(job.jwk, job.jwk.alg);
  const token = await new jose.SignJWT(job.claims)
    .setProtectedHeader({ alg: job.jwk.alg, kid: job.jwk.kid, typ: "JWT" })
    .sign(key);
  console.log(JSON.stringify({ token }));
}
"""


def a_chain() -> Chain:
    now = time.time()
    return Chain((Hop("planner", "plan"), Hop("budget")), new_root(), "default", now, now + 300)


def key_pair(alg: str) -> tuple[Keyring, dict[str, str], dict[str, str]]:
    """(the signer's keyring, the public JWK, the private JWK)."""
    kid, private, jwk = generate_key_pair(alg, f"svc-{alg}")
    return Keyring.parse(f"{kid}:{private}"), jwk, {**jwk, "d": private.split(":", 1)[1]}


@pytest.mark.parametrize("alg", ALGS)
def test_pyjwt_verifies_the_guards_tokens(alg: str) -> None:
    signer, jwk, _ = key_pair(alg)
    chain = a_chain()
    token = encode(chain, signer)
    claims = jwt.decode(token, jwt.PyJWK(jwk).key, algorithms=[jwk["alg"]])
    assert claims["hops"] == [["planner", "plan"], ["budget", None]]
    assert claims["root"] == chain.root
    other = jwt.PyJWK(key_pair(alg)[1]).key
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, other, algorithms=[jwk["alg"]])


@pytest.mark.parametrize("alg", ALGS)
def test_the_guard_verifies_pyjwts_tokens(alg: str) -> None:
    _, jwk, private = key_pair(alg)
    chain = a_chain()
    claims = json.loads(jwt.utils.base64url_decode(encode(chain, None).split(".")[1]))
    token = jwt.encode(claims, jwt.PyJWK(private).key, algorithm=jwk["alg"], headers={"kid": jwk["kid"]})
    verifier = Keyring(public=PublicKeys.of({"keys": [jwk]}))
    assert decode(token, verifier) == chain


@pytest.fixture(scope="session")
def jose_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Node script over ``jose``, which scripts/bootstrap installs with npm in tests/core/jose."""
    assert NODE is not None, "node is not installed: run scripts/bootstrap (Debian: nodejs)"
    assert (JOSE_MODULES / "jose").is_dir(), f"jose is not installed in {JOSE_MODULES}: run scripts/bootstrap"
    directory = tmp_path_factory.mktemp("jose")
    (directory / "package.json").write_text('{"type": "module", "private": true}', encoding="utf-8")
    (directory / "node_modules").symlink_to(JOSE_MODULES, target_is_directory=True)
    script = directory / "jose_job.mjs"
    script.write_text(JOSE_SCRIPT, encoding="utf-8")
    return script


def run_jose(script: Path, job: dict[str, Any]) -> dict[str, Any]:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(script)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=script.parent,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("alg", ALGS)
def test_node_jose_verifies_the_guards_tokens(alg: str, jose_script: Path) -> None:
    signer, jwk, _ = key_pair(alg)
    chain = a_chain()
    result = run_jose(jose_script, {"mode": "verify", "token": encode(chain, signer), "jwk": jwk})
    assert result["protectedHeader"] == {"alg": jwk["alg"], "kid": jwk["kid"], "typ": "JWT"}
    assert result["payload"]["hops"] == [["planner", "plan"], ["budget", None]]
    assert result["payload"]["root"] == chain.root


@pytest.mark.parametrize("alg", ALGS)
def test_the_guard_verifies_node_joses_tokens(alg: str, jose_script: Path) -> None:
    _, jwk, private = key_pair(alg)
    chain = a_chain()
    claims = json.loads(jwt.utils.base64url_decode(encode(chain, None).split(".")[1]))
    token = run_jose(jose_script, {"mode": "sign", "jwk": private, "claims": claims})["token"]
    assert decode(token, Keyring(public=PublicKeys.of({"keys": [jwk]}))) == chain
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(ValueError, match="signature"):
        decode(tampered, Keyring(public=PublicKeys.of({"keys": [jwk]})))
