"""Per-service keys (docs/spec.md §9, docs/security.md "Per-service keys"): EdDSA and ES256 key pairs
in ``keys``, public keys in a ``jwks`` file, a verify-only process, algorithm confusion refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

import otel_guard
from otel_guard import delegate
from otel_guard._jwk import PublicKeys
from otel_guard.chain import (
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    NoSigningKey,
    decode,
    encode,
    generate_key_pair,
    new_root,
    start_chain,
)
from otel_guard.cli import main as cli_main
from otel_guard.settings import configure, settings_from_env

ALGS = ["ed25519", "es256"]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64json(value: Any) -> str:
    return b64(json.dumps(value, separators=(",", ":")).encode())


def a_chain(*agents: str) -> Chain:
    now = time.time()
    return Chain(tuple(Hop(a) for a in agents or ("planner",)), new_root(), "default", now, now + 300)


class Pair:
    """A service's key pair as keygen makes it: its OTEL_GUARD_KEYS value and its public JWK."""

    def __init__(self, alg: str, kid: str) -> None:
        self.kid, private, self.jwk = generate_key_pair(alg, kid)
        self.env = f"{self.kid}:{private}"
        self.d = private.split(":", 1)[1]

    def signer(self) -> Keyring:
        return Keyring.parse(self.env)

    def jwks(self, *others: Pair) -> dict[str, Any]:
        return {"keys": [self.jwk, *[o.jwk for o in others]]}

    def verifier(self, *others: Pair) -> Keyring:
        return Keyring(public=PublicKeys.of(self.jwks(*others)))

    def private_jwk(self) -> dict[str, str]:
        return {**self.jwk, "d": self.d}


@pytest.fixture(params=ALGS)
def pair(request: pytest.FixtureRequest) -> Pair:
    return Pair(request.param, f"svc-{request.param}")


# -- round trips ------------------------------------------------------------------------------------


def test_a_key_pair_signs_and_its_public_key_verifies(pair: Pair) -> None:
    chain = a_chain("planner", "budget")
    token = encode(chain, pair.signer())
    header = jwt.get_unverified_header(token)
    assert header == {"alg": pair.jwk["alg"], "kid": pair.kid, "typ": "JWT"}
    assert len(base64.urlsafe_b64decode(token.rsplit(".", 1)[1] + "==")) == 64  # ES256: r || s, not DER
    assert decode(token, pair.signer()) == chain  # the signer verifies its own
    assert decode(token, pair.verifier()) == chain  # and so does a process with its public key only
    other = Pair(pair.jwk["alg"] if pair.jwk["alg"] == "ES256" else "ed25519", pair.kid)  # same kid
    with pytest.raises(InvalidToken, match="signature does not match"):
        decode(token, other.verifier())


def test_a_token_altered_after_signing_is_refused(pair: Pair) -> None:
    token = encode(a_chain("planner", "budget"), pair.signer())
    header, claims, signature = token.split(".")
    tampered = json.loads(base64.urlsafe_b64decode(claims + "=="))
    tampered["hops"] = [["planner", None]]  # trimmed
    # One signature character changed where all six of its bits count (the last one's low bits are
    # padding: "AA" there may be the same signature, once in 256 tokens).
    flipped = signature[:10] + ("B" if signature[10] == "A" else "A") + signature[11:]
    for forged in (
        f"{header}.{b64json(tampered)}.{signature}",
        f"{header}.{claims}.{flipped}",
        f"{header}.{claims}.",
        f"{header}.{claims}.{signature}AAAA",
    ):
        with pytest.raises(InvalidToken):
            decode(forged, pair.verifier())


def test_rotation_first_key_signs_every_key_verifies() -> None:
    old, new = Pair("ed25519", "old"), Pair("es256", "new")
    during = Keyring.parse(f"{new.env},{old.env}")
    assert during.signing is not None
    assert during.signing.kid == "new"
    minted_before = encode(a_chain(), old.signer())
    minted_during = encode(a_chain(), during)
    verifiers = new.verifier(old)  # both public keys in the JWKS while both are in use
    assert decode(minted_before, verifiers).agents == ("planner",)
    assert decode(minted_during, verifiers).agents == ("planner",)
    assert jwt.get_unverified_header(minted_during)["kid"] == "new"
    with pytest.raises(InvalidToken, match="unknown key id 'new'"):
        decode(minted_during, old.verifier())


def test_shared_secrets_and_key_pairs_mix_in_one_keyring() -> None:
    pair = Pair("ed25519", "svc")
    secret = b"s" * 32
    keyring = Keyring.parse(f"shared:HS256:{b64(secret)},{pair.env}")
    assert keyring.kids == ("shared", "svc")
    token = encode(a_chain(), keyring)
    assert jwt.decode(token, secret, algorithms=["HS256"])["v"] == 1
    assert decode(encode(a_chain(), pair.signer()), keyring).depth == 1


def test_a_private_key_object_is_a_key_in_configure() -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    settings = configure(keys={"svc": private})
    assert settings.keys is not None
    assert settings.keys.signing is not None
    assert settings.keys.signing.alg == "EdDSA"
    token = encode(a_chain(), settings.keys)
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert jwt.decode(token, public, algorithms=["EdDSA"])["v"] == 1
    with pytest.raises(ValueError, match="P-256"):
        configure(keys={"svc": ec.generate_private_key(ec.SECP384R1())})


# -- algorithm confusion ----------------------------------------------------------------------------


def _hs256(header: dict[str, Any], claims: Chain, secret: bytes) -> str:
    body = json.loads(base64.urlsafe_b64decode(encode(claims, None).split(".")[1] + "=="))
    signing_input = f"{b64json(header)}.{b64json(body)}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


def test_hs256_signed_with_the_public_key_as_secret_is_refused(pair: Pair) -> None:
    """The classic attack: the verifier's public key is no secret; an HS256 token 'signed' with it
    (its raw bytes, its JWK text, its PEM) must not pass as if the key were a shared secret."""
    verifier = pair.verifier()
    public = verifier.key_for(verifier._by_kid[pair.kid].header)
    pem = public._public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    raw_x = base64.urlsafe_b64decode(pair.jwk["x"] + "==")
    for secret in (raw_x, json.dumps(pair.jwk).encode(), pem):
        forged = _hs256({"alg": "HS256", "kid": pair.kid, "typ": "JWT"}, a_chain(), secret)
        with pytest.raises(InvalidToken, match=f"HS256 does not match key '{pair.kid}'"):
            decode(forged, verifier)
        with pytest.raises(InvalidToken):
            decode(forged, pair.signer())


def test_alg_none_and_other_algorithms_fail_with_public_keys(pair: Pair) -> None:
    chain = a_chain()
    claims = encode(chain, None).split(".")[1]
    other_alg = "ES256" if pair.jwk["alg"] == "EdDSA" else "EdDSA"
    signature = encode(chain, pair.signer()).split(".")[2]
    for forged in (
        encode(chain, None),  # unsigned
        f"{b64json({'alg': 'none', 'kid': pair.kid})}.{claims}.{signature}",
        f"{b64json({'alg': other_alg, 'kid': pair.kid})}.{claims}.{signature}",
        f"{b64json({'alg': 'RS256', 'kid': pair.kid})}.{claims}.{signature}",
    ):
        with pytest.raises(InvalidToken):
            decode(forged, pair.verifier())


def test_an_es256_signature_in_der_form_is_refused() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    keyring = Keyring({"svc": private})
    token = encode(a_chain(), keyring)
    signing_input = token.rsplit(".", 1)[0]
    der = private.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256()))  # a valid signature, DER
    with pytest.raises(InvalidToken, match="signature"):
        decode(f"{signing_input}.{b64(der)}", keyring)


def test_an_asymmetric_header_naming_a_shared_secret_is_refused() -> None:
    secret = b"s" * 32
    keyring = Keyring({"k1": secret})
    pair = Pair("ed25519", "k1")
    with pytest.raises(InvalidToken, match="EdDSA does not match key 'k1'"):
        decode(encode(a_chain(), pair.signer()), keyring)


# -- a process with public keys only ----------------------------------------------------------------


def test_a_verify_only_keyring_signs_nothing(pair: Pair) -> None:
    verifier = pair.verifier()
    assert verifier.signing is None
    started = ChainToken(start_chain(Hop("planner"), "default", time.time(), 300), verifier)
    assert not started.travels
    with pytest.raises(NoSigningKey, match="public keys only"):
        str(started)
    with pytest.raises(NoSigningKey):
        encode(a_chain(), verifier)


def test_a_verify_only_hop_sends_the_chain_on_as_it_arrived(pair: Pair) -> None:
    arrived = encode(a_chain("planner", "budget"), pair.signer())
    configure(jwks=pair.jwks())
    with otel_guard_chain_in_baggage(arrived), delegate("third-party"), delegate("helper") as hop:
        chain = otel_guard.current_chain()
        assert chain is not None
        assert chain.agents == ("planner", "budget", "third-party", "helper")
        sent = _carried()
    assert hop is not None
    assert sent == arrived  # not re-signed (it cannot be), not unsigned: the arrived token itself
    assert decode(sent, pair.verifier()).agents == ("planner", "budget")


def test_a_verify_only_process_refuses_unsigned_and_unknown_chains(pair: Pair) -> None:
    configure(jwks=pair.jwks())
    for value in (encode(a_chain(), None), encode(a_chain(), Pair("ed25519", "stranger").signer())):
        with (
            otel_guard_chain_in_baggage(value),
            pytest.raises(otel_guard.DelegationRefused) as refused,
            delegate("helper"),
        ):
            pass
        assert refused.value.reason == "bad_signature"


def otel_guard_chain_in_baggage(value: str) -> Any:
    from contextlib import contextmanager

    from opentelemetry import baggage, context

    @contextmanager
    def attached() -> Any:
        token = context.attach(baggage.set_baggage("otel_guard.chain", value))
        try:
            yield
        finally:
            context.detach(token)

    return attached()


def _carried() -> str:
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    from urllib.parse import unquote

    for member in carrier["baggage"].split(","):
        name, _, value = member.partition("=")
        if name.strip() == "otel_guard.chain":
            return unquote(value)
    raise AssertionError(carrier)


# -- settings ----------------------------------------------------------------------------------------


def write(tmp_path: Path, content: Any, name: str = "jwks.json") -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return str(path)


def test_jwks_from_the_environment_verifies_and_keys_signs(tmp_path: Path) -> None:
    a, b = Pair("ed25519", "svc-a"), Pair("es256", "svc-b")
    path = write(tmp_path, a.jwks(b))
    verifier = settings_from_env({"OTEL_GUARD_JWKS": path})
    assert verifier.keys is not None
    assert verifier.keys.signing is None
    assert verifier.keys.kids == ("svc-a", "svc-b")
    assert "svc-a" in repr(verifier)
    assert a.d not in repr(verifier)
    # A signer with the fleet's one JWKS file (its own public key in it too).
    signer = settings_from_env({"OTEL_GUARD_KEYS": b.env, "OTEL_GUARD_JWKS": path})
    assert signer.keys is not None
    assert signer.keys.signing is not None
    assert signer.keys.signing.kid == "svc-b"
    token = encode(a_chain(), signer.keys)
    assert decode(token, verifier.keys).depth == 1
    assert decode(encode(a_chain(), a.signer()), signer.keys).depth == 1
    # configure() keeps the two apart: dropping the JWKS leaves the signer's own keys.
    configure(keys=b.env, jwks=path)
    after = configure(jwks="")
    assert after.keys is not None
    assert after.keys.kids == ("svc-b",)
    assert configure(keys="").keys is None


BAD_JWKS = {
    "not JSON": ("{'keys': []", "is not JSON"),
    "not a JWKS": ({"kty": "OKP"}, '{"keys": [...]}'),
    "no keys": ({"keys": []}, "holds no key"),
    "RSA": ({"keys": [{"kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB"}]}, "kty 'RSA'"),
    "X25519": ({"keys": [{"kty": "OKP", "crv": "X25519", "kid": "x", "x": "A" * 43}]}, "crv 'X25519'"),
    "P-384": ({"keys": [{"kty": "EC", "crv": "P-384", "kid": "p", "x": "A", "y": "A"}]}, "crv 'P-384'"),
    "a shared secret": ({"keys": [{"kty": "oct", "kid": "s", "k": "c2VjcmV0"}]}, "private key material (k)"),
    "no kid": ({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "A" * 43}]}, "needs a key id"),
    "x too short": ({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "e", "x": "AAAA"}]}, "32 bytes"),
    "not on the curve": (
        {"keys": [{"kty": "EC", "crv": "P-256", "kid": "p", "x": "A" * 43, "y": "B" * 43}]},
        "not a point of the curve",
    ),
    "use enc": (
        {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "e", "x": "A" * 43, "use": "enc"}]},
        "use 'enc'",
    ),
}


@pytest.mark.parametrize(("content", "message"), BAD_JWKS.values(), ids=BAD_JWKS.keys())
def test_a_bad_jwks_file_is_a_settings_error_at_start(tmp_path: Path, content: Any, message: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ValueError, match="OTEL_GUARD_JWKS: jwks: ") as error:
        settings_from_env({"OTEL_GUARD_JWKS": path})
    assert message in str(error.value)


def test_private_parts_and_duplicate_kids_in_a_jwks_are_refused(tmp_path: Path, pair: Pair) -> None:
    with pytest.raises(ValueError, match=r"private key material \(d\)") as error:
        settings_from_env({"OTEL_GUARD_JWKS": write(tmp_path, {"keys": [pair.private_jwk()]})})
    assert pair.d not in str(error.value)
    with pytest.raises(ValueError, match=f"key id '{pair.kid}' is listed twice"):
        settings_from_env({"OTEL_GUARD_JWKS": write(tmp_path, {"keys": [pair.jwk, pair.jwk]})})
    other = Pair("ed25519", pair.kid)
    with pytest.raises(
        ValueError, match=r"OTEL_GUARD_JWKS: jwks: key id .* is also in keys, with another key"
    ):
        settings_from_env({"OTEL_GUARD_KEYS": other.env, "OTEL_GUARD_JWKS": write(tmp_path, pair.jwks())})
    with pytest.raises(ValueError, match="cannot read"):
        settings_from_env({"OTEL_GUARD_JWKS": str(tmp_path / "missing.json")})


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("svc:RS256:AAAA", "names the algorithm 'RS256'"),
        ("svc:EdDSA:" + b64(b"x" * 31), "must be 32 bytes"),
        ("svc:ES256:" + b64(b"\xff" * 32), "not a P-256 private key"),
        ("svc:EdDSA:not*base64", "not base64url"),
    ],
)
def test_a_bad_private_key_in_keys_is_a_settings_error(keys: str, message: str) -> None:
    with pytest.raises(ValueError, match="OTEL_GUARD_KEYS: keys: ") as error:
        settings_from_env({"OTEL_GUARD_KEYS": keys})
    assert message in str(error.value)


# -- keygen -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ALGS)
def test_keygen_prints_the_signer_line_and_the_public_jwk(
    alg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["keygen", "--alg", alg, "--kid", "svc"]) == 0
    line, jwk_text = capsys.readouterr().out.splitlines()
    assert line.startswith("OTEL_GUARD_KEYS=svc:")
    jwk = json.loads(jwk_text)
    assert jwk["kid"] == "svc"
    assert "d" not in jwk
    signer = settings_from_env({"OTEL_GUARD_KEYS": line.split("=", 1)[1]}).keys
    assert signer is not None
    token = encode(a_chain(), signer)
    assert decode(token, Keyring(public=PublicKeys.of({"keys": [jwk]}))).depth == 1
    assert jwt.decode(token, jwt.PyJWK(jwk).key, algorithms=[jwk["alg"]])["v"] == 1
