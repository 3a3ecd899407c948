"""Per-service keys: Ed25519 (``EdDSA``, RFC 8037) and P-256 (``ES256``) keys, and JWKS files of them.

A service signs with its own private key; the processes it calls verify with its public key, read
from a JWK Set (RFC 7517) file, and hold nothing that signs. The primitives are the ``cryptography``
package's (an optional dependency: ``pip install 'otel-guard[keys]'``); this module only adds the
JOSE forms around them.

What a reader would not guess: an ES256 signature in a JWS is the two 32-byte integers ``r || s``
(RFC 7518 §3.4), not the DER sequence ``cryptography`` (and OpenSSL) produce and expect; every
signature is turned from one form to the other here, and a signature of any other length is refused
before it reaches the library.

In ``OTEL_GUARD_KEYS`` a signer's private key is ``kid:EdDSA:<d>`` or ``kid:ES256:<d>``, ``<d>``
being the ``d`` member of the key's private JWK, base64url (32 bytes either way: Ed25519's seed, the
P-256 private scalar). The public half is derived from it, so a key pair is never given twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from functools import cache
from types import SimpleNamespace
from typing import Any, Final

from otel_guard._jws import _KID, KID_RULE, InvalidToken, _b64decode, _b64encode

EDDSA: Final = "EdDSA"
ES256: Final = "ES256"
ALGORITHMS: Final = (EDDSA, ES256)
"""The asymmetric JWS algorithms a key may be for, as ``OTEL_GUARD_KEYS`` and ``keygen`` name them."""
SIGNATURE_BYTES: Final = 64  # Ed25519's and ES256's (r || s, 32 bytes each) alike
MAX_JWKS_BYTES: Final = 1 << 20
"""The largest JWKS file read (1 MiB: thousands of public keys)."""
# Members of a JWK that only a private key (or a shared secret) has: none may stand in a JWKS of
# public keys (RFC 7518 §6.2.2, §6.3.2, §6.4; RFC 8037 §2).
_PRIVATE_MEMBERS: Final = ("d", "p", "q", "dp", "dq", "qi", "oth", "k")
_P256_BYTES: Final = 32


@cache
def _crypto() -> Any:
    """The ``cryptography`` primitives (imported once), or a ``ValueError`` that says how to install
    them."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, utils
    except ImportError:
        raise ValueError(
            "EdDSA and ES256 keys need the cryptography package: pip install 'otel-guard[keys]'"
        ) from None
    return SimpleNamespace(
        InvalidSignature=InvalidSignature,
        ec=ec,
        ed25519=ed25519,
        utils=utils,
        serialization=serialization,
        ecdsa=ec.ECDSA(hashes.SHA256()),
    )


class AsymmetricKey:
    """One Ed25519 or P-256 key: its public half always (verifies), its private half when this
    process signs with it (:attr:`can_sign`).

    The same interface as the HMAC key of :mod:`otel_guard.chain`: ``kid``, ``alg``, ``header``
    (the base64url JWS header this library writes for it), ``sign(message)``, ``verify(message,
    signature)``, ``signature_length`` (characters of the base64url signature).
    """

    __slots__ = ("_private", "_public", "alg", "aliases", "header", "jwk", "kid", "signature_length")

    signature_length: int

    def __init__(self, kid: str, alg: str, public: Any, private: Any = None) -> None:
        self.kid = kid
        self.alg = alg
        # RFC 9864 names Ed25519 itself as an algorithm ("Ed25519"), the same signatures as EdDSA's.
        self.aliases = frozenset({alg, "Ed25519"} if alg == EDDSA else {alg})
        self._public = public
        self._private = private
        self.header = _b64encode(
            json.dumps({"alg": alg, "kid": kid, "typ": "JWT"}, separators=(",", ":")).encode()
        )
        self.signature_length = (4 * SIGNATURE_BYTES + 2) // 3
        self.jwk = _public_jwk(kid, alg, public)

    @property
    def can_sign(self) -> bool:
        return self._private is not None

    @property
    def secret(self) -> tuple[str, str]:
        """What tells two keys apart (:class:`~otel_guard.keys.Keyring` equality): the public JWK's
        ``x`` and ``y``, and whether it signs. Never the private key."""
        return (self.jwk["x"] + self.jwk.get("y", ""), "private" if self.can_sign else "public")

    def sign(self, message: bytes) -> bytes:
        """The JWS signature of ``message`` (64 bytes; ES256's as r || s)."""
        if self._private is None:
            raise ValueError(f"key {self.kid!r} is a public key: it verifies and cannot sign")
        if self.alg == EDDSA:
            signature: bytes = self._private.sign(message)
            return signature
        crypto = _crypto()
        r, s = crypto.utils.decode_dss_signature(self._private.sign(message, crypto.ecdsa))
        return bytes(r.to_bytes(_P256_BYTES, "big") + s.to_bytes(_P256_BYTES, "big"))

    def verify(self, message: bytes, signature: str) -> bool:
        """Whether ``signature`` (the token's base64url third part) is this key's over ``message``."""
        try:
            raw = _b64decode(signature)
        except InvalidToken:
            return False
        if len(raw) != SIGNATURE_BYTES:
            return False
        crypto = _crypto()
        try:
            if self.alg == EDDSA:
                self._public.verify(raw, message)
            else:
                r = int.from_bytes(raw[:_P256_BYTES], "big")
                s = int.from_bytes(raw[_P256_BYTES:], "big")
                self._public.verify(crypto.utils.encode_dss_signature(r, s), message, crypto.ecdsa)
        except crypto.InvalidSignature:
            return False
        return True

    def same_public_key(self, other: AsymmetricKey) -> bool:
        return (
            self.alg == other.alg
            and self.jwk["x"] == other.jwk["x"]
            and self.jwk.get("y") == other.jwk.get("y")
        )

    def __repr__(self) -> str:  # never shows a private key
        return f"AsymmetricKey(kid={self.kid!r}, alg={self.alg!r}, signs={self.can_sign})"


def _public_jwk(kid: str, alg: str, public: Any) -> dict[str, str]:
    if alg == EDDSA:
        serialization = _crypto().serialization
        raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return {"kty": "OKP", "crv": "Ed25519", "x": _b64encode(raw), "kid": kid, "alg": alg, "use": "sig"}
    numbers = public.public_numbers()
    return {
        "kty": "EC",
        "crv": "P-256",
        "x": _b64encode(numbers.x.to_bytes(_P256_BYTES, "big")),
        "y": _b64encode(numbers.y.to_bytes(_P256_BYTES, "big")),
        "kid": kid,
        "alg": alg,
        "use": "sig",
    }


# -- private keys (OTEL_GUARD_KEYS) ---------------------------------------------------------------


def algorithm(name: str) -> str | None:
    """The asymmetric algorithm ``name`` means (``EdDSA``, ``ES256``; any case; ``Ed25519`` for
    EdDSA), or ``None``."""
    folded = name.strip().lower()
    if folded in ("eddsa", "ed25519"):
        return EDDSA
    if folded == "es256":
        return ES256
    return None


def private_key(kid: str, alg: str, d: bytes) -> AsymmetricKey:
    """The key pair whose private JWK member ``d`` is ``d``; ``ValueError`` names what is wrong."""
    crypto = _crypto()
    if len(d) != _P256_BYTES:
        raise ValueError(f"keys: the {alg} private key of {kid!r} must be 32 bytes, not {len(d)}")
    if alg == EDDSA:
        private = crypto.ed25519.Ed25519PrivateKey.from_private_bytes(d)
    else:
        try:
            private = crypto.ec.derive_private_key(int.from_bytes(d, "big"), crypto.ec.SECP256R1())
        except ValueError:
            raise ValueError(f"keys: the ES256 private key of {kid!r} is not a P-256 private key") from None
    return AsymmetricKey(kid, alg, private.public_key(), private)


def from_private_object(kid: str, key: object) -> AsymmetricKey | None:
    """The key of a ``cryptography`` private key object (Ed25519 or P-256), ``None`` for anything else."""
    try:
        crypto = _crypto()
    except ValueError:
        return None
    if isinstance(key, crypto.ed25519.Ed25519PrivateKey):
        return AsymmetricKey(kid, EDDSA, key.public_key(), key)
    if isinstance(key, crypto.ec.EllipticCurvePrivateKey):
        if not isinstance(key.curve, crypto.ec.SECP256R1):
            raise ValueError(f"keys: the key of {kid!r} is on {key.curve.name}; ES256 needs P-256")
        return AsymmetricKey(kid, ES256, key.public_key(), key)
    return None


def generate(kid: str, alg: str) -> tuple[str, dict[str, str]]:
    """A fresh key pair: (the base64url ``d`` for ``OTEL_GUARD_KEYS``, the public JWK)."""
    crypto = _crypto()
    private: Any
    if alg == EDDSA:
        private = crypto.ed25519.Ed25519PrivateKey.generate()
        serialization = crypto.serialization
        d = private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
    else:
        private = crypto.ec.generate_private_key(crypto.ec.SECP256R1())
        d = private.private_numbers().private_value.to_bytes(_P256_BYTES, "big")
    key = AsymmetricKey(kid, alg, private.public_key(), private)
    return _b64encode(d), dict(key.jwk)


# -- public keys (OTEL_GUARD_JWKS) ----------------------------------------------------------------


class PublicKeys:
    """The public keys of a JWKS: what a process verifies with and cannot sign with (setting ``jwks``).

    Read once where the guard starts; a file that is not a JWKS of Ed25519 / P-256 public keys, each
    with its own key id, is a settings error there, naming the key and what is wrong with it.
    """

    __slots__ = ("keys", "source")

    def __init__(self, keys: Iterable[AsymmetricKey], source: str = "") -> None:
        self.keys = tuple(keys)
        self.source = source

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(key.kid for key in self.keys)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> PublicKeys:
        """The public keys of the JWKS file at ``path``; ``ValueError`` says what is wrong with it."""
        shown = os.fspath(path)
        try:
            with open(path, "rb") as file:
                raw = file.read(MAX_JWKS_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"jwks: cannot read {shown!r} ({exc.strerror or type(exc).__name__})") from None
        if len(raw) > MAX_JWKS_BYTES:
            raise ValueError(f"jwks: {shown!r} is larger than {MAX_JWKS_BYTES} bytes")
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"jwks: {shown!r} is not JSON ({type(exc).__name__}: {exc})"[:300]) from None
        return cls.of(document, shown)

    @classmethod
    def of(cls, document: object, source: str = "") -> PublicKeys:
        """The public keys of a JWKS already read (``{"keys": [...]}``)."""
        where = f"{source!r}: " if source else ""
        if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
            raise ValueError(f'jwks: {where}a JWKS is a JSON object {{"keys": [...]}} (RFC 7517 §5)')
        keys: list[AsymmetricKey] = []
        seen: set[str] = set()
        for number, jwk in enumerate(document["keys"], 1):
            key = public_key(jwk, f"{where}key {number}")
            if key.kid in seen:
                raise ValueError(f"jwks: {where}key id {key.kid!r} is listed twice")
            seen.add(key.kid)
            keys.append(key)
        if not keys:
            raise ValueError(f"jwks: {where}the JWKS holds no key")
        return cls(keys, source)

    def __repr__(self) -> str:
        return f"<JWKS {', '.join(self.kids)}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKeys) and [k.jwk for k in self.keys] == [k.jwk for k in other.keys]

    def __hash__(self) -> int:
        return hash(self.kids)


def public_key(jwk: object, where: str) -> AsymmetricKey:
    """The verifying key of one public JWK (OKP Ed25519 or EC P-256)."""
    if not isinstance(jwk, Mapping):
        raise ValueError(f"jwks: {where} is not a JSON object")
    kid = jwk.get("kid")
    if not isinstance(kid, str) or _KID.fullmatch(kid) is None:
        raise ValueError(f"jwks: {where} needs a key id (kid) of {KID_RULE}, not {_cut(kid)}")
    where = f"{where} ({kid!r})"
    private = [member for member in _PRIVATE_MEMBERS if member in jwk]
    if private:
        raise ValueError(
            f"jwks: {where} holds private key material ({', '.join(private)}): a JWKS of public keys "
            "may hold no secret (the private key goes in the signer's OTEL_GUARD_KEYS)"
        )
    kty, crv = jwk.get("kty"), jwk.get("crv")
    if (kty, crv) == ("OKP", "Ed25519"):
        alg = EDDSA
    elif (kty, crv) == ("EC", "P-256"):
        alg = ES256
    else:
        raise ValueError(
            f"jwks: {where} is kty {_cut(kty)} crv {_cut(crv)}; the keys verified are "
            "OKP Ed25519 (EdDSA) and EC P-256 (ES256)"
        )
    declared = jwk.get("alg")
    if declared is not None and declared not in ({EDDSA, "Ed25519"} if alg == EDDSA else {ES256}):
        raise ValueError(f"jwks: {where} says alg {_cut(declared)}, but a {crv} key is for {alg}")
    use = jwk.get("use")
    if use is not None and use != "sig":
        raise ValueError(f"jwks: {where} has use {_cut(use)}; a key that verifies chains has use 'sig'")
    ops = jwk.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        raise ValueError(f"jwks: {where} has key_ops {_cut(ops)} without 'verify'")
    crypto = _crypto()
    x = _coordinate(jwk, "x", where)
    try:
        if alg == EDDSA:
            public: Any = crypto.ed25519.Ed25519PublicKey.from_public_bytes(x)
        else:
            y = _coordinate(jwk, "y", where)
            public = crypto.ec.EllipticCurvePublicNumbers(
                int.from_bytes(x, "big"), int.from_bytes(y, "big"), crypto.ec.SECP256R1()
            ).public_key()
    except ValueError:
        raise ValueError(
            f"jwks: {where} is not a valid {crv} public key (not a point of the curve)"
        ) from None
    return AsymmetricKey(kid, alg, public)


def _coordinate(jwk: Mapping[str, Any], name: str, where: str) -> bytes:
    value = jwk.get(name)
    try:
        raw = _b64decode(value) if isinstance(value, str) else b""
    except InvalidToken:
        raw = b""
    if len(raw) != _P256_BYTES:  # Ed25519's x and P-256's x, y are 32 bytes (RFC 8037 §2, RFC 7518 §6.2.1)
        raise ValueError(f"jwks: {where} member {name!r} must be 32 bytes in base64url")
    return raw


def _cut(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:63] + "…"
