"""The JWS basics every token module shares: base64url, JSON objects, key ids, the token error.

Below :mod:`otel_guard.chain` and the keys (:mod:`otel_guard.keys`, :mod:`otel_guard._jwk`), which
import it and nothing else of ours. What a reader would not guess: base64url is decoded strictly (the
standard alphabet and padding are refused), as a token's text is compared byte for byte.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Mapping
from typing import Any, Final

MIN_SECRET_BYTES: Final = 32
# Text a token's sender chose (a key id, an algorithm, a claim) is quoted in refusals cut to this.
MAX_QUOTED: Final = 64
_KID = re.compile(r"[A-Za-z0-9._~-]{1,64}")
KID_RULE: Final = "1-64 characters of A-Z a-z 0-9 . _ ~ -"
_COMPACT = (",", ":")


class InvalidToken(ValueError):
    """A token that is not a valid delegation chain; the message says what is wrong with it."""


# base64url with the standard codec: the alphabet is mapped to the standard one, and the standard
# characters are mapped to "*" so that strict decoding refuses them (and "=", as JWS has no padding).
_FROM_B64URL: Final = bytes.maketrans(b"-_+/=", b"+/***")
_TO_B64URL: Final = bytes.maketrans(b"+/", b"-_")
_PADDING: Final = (b"", b"===", b"==", b"=")


def _b64encode(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).translate(_TO_B64URL).rstrip(b"=").decode("ascii")


def _b64decode(segment: str) -> bytes:
    try:
        data = segment.encode("ascii").translate(_FROM_B64URL)
        return binascii.a2b_base64(data + _PADDING[len(data) & 3], strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidToken(f"token is not base64url ({exc})") from None


_JSON = json.JSONDecoder()


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    return _json_text(raw, what)[1]


def _json_text(raw: bytes, what: str) -> tuple[str, dict[str, Any]]:
    """``raw`` as text, and the JSON object it holds; raises :class:`InvalidToken` for anything else."""
    try:
        text = raw.decode()
        # raw_decode skips json.loads' encoding sniffing and trailing-whitespace scan (a third of
        # its cost here); anything after the value is refused below.
        value, end = _JSON.raw_decode(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidToken(f"token {what} is not JSON ({type(exc).__name__})") from None
    if end != len(text):
        raise InvalidToken(f"token {what} has data after its JSON value")
    if not isinstance(value, dict):
        raise InvalidToken(f"token {what} is not a JSON object")
    return text, value


def quoted(value: object) -> str:
    """``repr(value)`` cut to MAX_QUOTED characters: how a refusal repeats what a sender chose."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 1] + "…"


def _check_header(fields: Mapping[str, Any]) -> None:
    """RFC 7515 4.1.11: a verifier must refuse a token whose ``crit`` names what it does not know."""
    if "crit" in fields:
        raise InvalidToken(
            f"token header lists critical extensions {quoted(fields['crit'])} this guard does not know"
        )
