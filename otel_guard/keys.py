"""The keys a process signs and verifies chain tokens with: shared secrets (HS256) and key pairs.

:class:`Keyring` holds this process's own keys (setting ``keys``: ``kid:secret`` for HS256, or
``kid:EdDSA:d`` / ``kid:ES256:d`` for a key pair of its own) and the public keys of a JWKS (setting
``jwks``, :mod:`otel_guard._jwk`), and finds the key a token's header names. What a reader would not
guess: the asymmetric keys' module (and so the ``cryptography`` package) is imported only where such
a key is used, so a process with shared secrets only never loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, TypeAlias

from otel_guard._jws import (
    _COMPACT,
    _KID,
    KID_RULE,
    MIN_SECRET_BYTES,
    InvalidToken,
    _b64decode,
    _b64encode,
    _check_header,
    _json_object,
    quoted,
)


class _Key:
    """One HMAC-SHA256 key, with its inner and outer hash states computed once (RFC 2104)."""

    __slots__ = ("_inner", "_outer", "header", "kid", "secret")

    alg: Final = "HS256"
    aliases: Final = frozenset({"HS256"})
    can_sign: Final = True
    signature_length: Final = 43  # base64url of 32 bytes

    def __init__(self, kid: str, secret: bytes) -> None:
        self.kid = kid
        self.secret = secret
        # The base64url JWS header this library writes for this key.
        self.header = _b64encode(
            json.dumps({"alg": "HS256", "kid": kid, "typ": "JWT"}, separators=_COMPACT).encode()
        )
        block = (hashlib.sha256(secret).digest() if len(secret) > 64 else secret).ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def sign(self, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message``: the same bytes as ``hmac.digest``, without re-keying each time."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def verify(self, message: bytes, signature: str) -> bool:
        """Whether ``signature`` (base64url) is this key's over ``message`` (compared in constant time)."""
        return hmac.compare_digest(_b64encode(self.sign(message)), signature)


if TYPE_CHECKING:
    from otel_guard._jwk import AsymmetricKey, PublicKeys

    AnyKey: TypeAlias = _Key | AsymmetricKey


class Keyring:
    """The keys a process signs and verifies with: the first of its own keys signs, every key verifies.

    Its own keys (setting ``keys``) are shared secrets (``HS256``) and private keys (``EdDSA``,
    ``ES256``: a key pair, its public half derived); the public keys of a JWKS (setting ``jwks``)
    verify only. A keyring of public keys only has no :attr:`signing` key: it verifies every chain
    and signs none (see :attr:`ChainToken.travels`). A token is verified with the key its header's
    ``kid`` names, and only with the algorithm that key is for: an ``HS256`` token naming a public
    key (its bytes taken for a secret, the classic confusion) is refused, as is ``none``.

    Rotation: add the new key second everywhere (its public key to the verifiers' JWKS), then move
    it first, then drop the old one.
    """

    __slots__ = ("_by_header", "_by_kid", "_own", "_public", "signing")

    signing: AnyKey | None

    def __init__(
        self,
        keys: Mapping[str, object] | Iterable[tuple[str, object]] = (),
        public: PublicKeys | Iterable[AsymmetricKey] | None = None,
    ) -> None:
        pairs = list(keys.items() if isinstance(keys, Mapping) else keys)
        published = tuple(_public_keys(public))
        if not pairs and not published:
            raise ValueError("keys: at least one key is needed")
        own: dict[str, AnyKey] = {}
        for kid, material in pairs:
            if not isinstance(kid, str) or _KID.fullmatch(kid) is None:
                raise ValueError(f"keys: key id {kid!r} must be {KID_RULE}")
            if kid in own:
                raise ValueError(f"keys: key id {kid!r} is listed twice")
            own[kid] = _own_key(kid, material)
        by_kid = dict(own)
        for key in published:
            known = by_kid.get(key.kid)
            if known is None:
                by_kid[key.kid] = key
            elif isinstance(known, _Key) or not known.same_public_key(key):
                raise ValueError(f"jwks: key id {key.kid!r} is also in keys, with another key")
            # else: the JWKS holds this signer's own public key (one file for a whole fleet): its own
            # key stands for it.
        self._own = tuple(own.values())
        self._public = published
        self._by_kid = by_kid
        self._by_header = {key.header: key for key in by_kid.values()}
        self.signing = self._own[0] if self._own else None

    @classmethod
    def parse(cls, text: str) -> Keyring:
        """Read ``OTEL_GUARD_KEYS``: comma-separated ``kid:secret`` (a shared secret, base64url, for
        ``HS256``; ``kid:HS256:secret`` says so explicitly) and ``kid:EdDSA:d`` / ``kid:ES256:d``
        (a private key: its JWK member ``d``, base64url; see :mod:`otel_guard._jwk`)."""
        pairs: list[tuple[str, object]] = []
        for number, raw in enumerate(text.split(","), 1):
            item = raw.strip()
            if not item:
                continue
            kid, sep, encoded = item.partition(":")
            if not sep:
                # Not repeated: an item without its "kid:" may be a bare secret.
                raise ValueError(f"keys: item {number} is not of the form kid:secret")
            kid = kid.strip()
            alg, sep, material = encoded.partition(":")
            if not sep:
                alg, material = "HS256", encoded
            alg = alg.strip()
            try:
                # Padding is accepted here (keys made with urlsafe_b64encode have it); tokens stay strict.
                decoded = _b64decode(material.strip().rstrip("="))
            except InvalidToken:
                raise ValueError(f"keys: the secret of key {kid!r} is not base64url") from None
            if alg.upper() == "HS256":
                pairs.append((kid, decoded))
                continue
            from otel_guard import _jwk

            asymmetric = _jwk.algorithm(alg)
            if asymmetric is None:
                raise ValueError(
                    f"keys: key {kid!r} names the algorithm {quoted(alg)}; one of HS256, EdDSA, ES256"
                )
            if _KID.fullmatch(kid) is None:
                raise ValueError(f"keys: key id {kid!r} must be {KID_RULE}")
            pairs.append((kid, _jwk.private_key(kid, asymmetric, decoded)))
        return cls(pairs)

    def with_public(self, public: PublicKeys | None) -> Keyring | None:
        """This keyring's own keys with the public keys ``public`` (replacing any it had), or ``None``
        when that leaves no key; itself when nothing changes (the guard's caches key on it)."""
        published = public.keys if public is not None else ()
        if published == self._public:
            return self
        if not self._own and not published:
            return None
        return Keyring([(key.kid, key) for key in self._own], published)

    @property
    def kids(self) -> tuple[str, ...]:
        """Every key id that verifies, its own keys' first."""
        return tuple(self._by_kid)

    def key_for(self, header: str) -> AnyKey:
        """The key a token's header segment names; raises :class:`InvalidToken` if there is none, or
        if the header's ``alg`` is not the one that key is for."""
        known = self._by_header.get(header)
        if known is not None:
            return known
        return self.key_read(header)

    def key_read(self, header: str) -> AnyKey:
        """:meth:`key_for` with the header read properly, not looked up by its text: for a header
        another library wrote (other key order, spacing), and the uncached path that the lookup
        must agree with (tests/core/test_cache_equivalence.py)."""
        fields = _json_object(_b64decode(header), "header")
        _check_header(fields)
        alg = fields.get("alg")
        if alg not in _ALGORITHMS:
            raise InvalidToken(f"token algorithm {quoted(alg)} is not HS256, EdDSA or ES256")
        kid = fields.get("kid")
        if not isinstance(kid, str):
            raise InvalidToken("token header has no key id (kid)")
        key = self._by_kid.get(kid)
        if key is None:
            raise InvalidToken(f"token is signed with unknown key id {quoted(kid)}")
        if alg not in key.aliases:
            raise InvalidToken(f"token algorithm {alg} does not match key {quoted(kid)}, an {key.alg} key")
        return key

    def __repr__(self) -> str:  # never shows a secret
        return f"Keyring(kids={list(self._by_kid)})"

    def _material(self) -> dict[str, tuple[str, object]]:
        return {kid: (key.alg, key.secret) for kid, key in self._by_kid.items()}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Keyring)
            and self.kids == other.kids
            and (self.signing.kid if self.signing else None) == (other.signing.kid if other.signing else None)
            and self._material() == other._material()
        )

    def __hash__(self) -> int:
        return hash(tuple(self._by_kid))


def _public_keys(public: PublicKeys | Iterable[AsymmetricKey] | None) -> Iterable[AsymmetricKey]:
    if public is None:
        return ()
    from otel_guard._jwk import PublicKeys

    return public.keys if isinstance(public, PublicKeys) else public


_ALGORITHMS: Final = ("HS256", "EdDSA", "Ed25519", "ES256")
"""The ``alg`` header values a token may name (``Ed25519``: RFC 9864's name for EdDSA on Ed25519)."""


def _own_key(kid: str, material: object) -> AnyKey:
    """The signing key of ``material``: secret bytes (HS256), or an Ed25519 / P-256 private key."""
    if isinstance(material, bytes | bytearray):
        if len(material) < MIN_SECRET_BYTES:
            raise ValueError(f"keys: the secret of key {kid!r} must be at least {MIN_SECRET_BYTES} bytes")
        return _Key(kid, bytes(material))
    if isinstance(material, _Key):
        return material
    from otel_guard import _jwk

    if isinstance(material, _jwk.AsymmetricKey):
        if not material.can_sign:
            raise ValueError(f"keys: key {kid!r} is a public key; public keys go in jwks")
        return material
    key = _jwk.from_private_object(kid, material)
    if key is None:
        raise ValueError(
            f"keys: the secret of key {kid!r} must be at least {MIN_SECRET_BYTES} bytes, "
            "or an Ed25519 or P-256 private key"
        )
    return key


def generate_key(kid: str | None = None) -> tuple[str, str]:
    """A fresh (key id, base64url secret of 32 random bytes) pair for ``OTEL_GUARD_KEYS``.

    Raises ``ValueError`` for a key id that ``OTEL_GUARD_KEYS`` would not accept (an empty one
    included: no silent random id in its place).
    """
    if kid is None:
        kid = f"k{secrets.token_hex(4)}"
    elif _KID.fullmatch(kid) is None:
        raise ValueError(f"key id {kid!r} must be {KID_RULE}")
    return kid, _b64encode(secrets.token_bytes(MIN_SECRET_BYTES))


def generate_key_pair(alg: str, kid: str | None = None) -> tuple[str, str, dict[str, str]]:
    """A fresh key pair for ``alg`` (``EdDSA``/``ed25519`` or ``ES256``): (key id, the
    ``OTEL_GUARD_KEYS`` value after ``kid:``, i.e. ``EdDSA:<d>``, and the public JWK for the
    verifiers' JWKS). ``ValueError`` for an unknown algorithm or a bad key id."""
    from otel_guard import _jwk

    asymmetric = _jwk.algorithm(alg)
    if asymmetric is None:
        raise ValueError(f"algorithm {alg!r} is not one of ed25519, es256")
    kid, _ = generate_key(kid)
    d, jwk = _jwk.generate(kid, asymmetric)
    return kid, f"{asymmetric}:{d}", jwk
