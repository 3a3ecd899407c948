"""The chain token (docs/spec.md §4): encoding, keyring, rotation, PyJWT interop, every bad token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import re
import time
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_guard import keys as keys_module
from otel_guard.chain import (
    MAX_QUOTED,
    MAX_TOKEN_LENGTH,
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    decode,
    encode,
    generate_key,
    name_problem,
    new_root,
    start_chain,
)

SECRET = b"s" * 32
NAME = st.text(min_size=1, max_size=30).filter(
    lambda name: name_problem(name) is None
)  # a name the guard takes
OTHER_SECRET = b"o" * 32
KEYRING = Keyring({"k1": SECRET})
ROOT = "0123456789abcdef0123456789abcdef"
FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64json(value: Any) -> str:
    return b64(json.dumps(value).encode())


def sample_chain(*hops: Hop, now: float | None = None) -> Chain:
    issued = time.time() if now is None else now
    return Chain(hops or (Hop("planner", "plan"), Hop("budget", None)), ROOT, "default", issued, issued + 300)


def good_claims(**changes: Any) -> dict[str, Any]:
    now = time.time()
    claims: dict[str, Any] = {
        "v": 1,
        "root": ROOT,
        "ws": "default",
        "iat": now,
        "exp": now + 300,
        "hops": [["planner", "plan"], ["budget", None]],
    }
    claims.update(changes)
    return claims


def signed(claims: Any, secret: bytes = SECRET, header: dict[str, Any] | None = None) -> str:
    """A compact JWS signed by hand (so claims may be anything, even malformed)."""
    head = b64json(header if header is not None else {"alg": "HS256", "kid": "k1", "typ": "JWT"})
    body = b64json(claims) if not isinstance(claims, bytes) else b64(claims)
    signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


def unsigned(claims: Any) -> str:
    return f"{b64json({'alg': 'none'})}.{b64json(claims)}."


# -- Hop, Chain, roots ----------------------------------------------------------------------------


def test_new_root_is_32_lowercase_hex_and_fresh() -> None:
    roots = {new_root() for _ in range(200)}
    assert len(roots) == 200
    assert all(re.fullmatch(r"[0-9a-f]{32}", root) for root in roots)


def test_start_chain_sets_lifetime_from_the_first_hop() -> None:
    chain = start_chain(Hop("planner", "plan"), "ws1", 1000.0, 60.0)
    assert chain.hops == (Hop("planner", "plan"),)
    assert chain.depth == 1
    assert (chain.workspace, chain.issued_at, chain.expires_at) == ("ws1", 1000.0, 1060.0)
    extended = chain.extended(Hop("budget"))
    assert extended.depth == 2
    assert (extended.root, extended.issued_at, extended.expires_at) == (chain.root, 1000.0, 1060.0)
    assert chain.depth == 1  # the original is unchanged


# -- encoding and decoding -------------------------------------------------------------------------


def test_signed_token_is_a_jws_with_the_contract_claims() -> None:
    chain = sample_chain()
    token = encode(chain, KEYRING)
    header, payload, signature = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "HS256", "kid": "k1", "typ": "JWT"}
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    assert claims == {
        "v": 1,
        "root": ROOT,
        "ws": "default",
        "iat": chain.issued_at,
        "exp": chain.expires_at,
        "hops": [["planner", "plan"], ["budget", None]],
    }
    assert len(signature) == 43  # 32 bytes of HMAC-SHA256, base64url without padding
    assert decode(token, KEYRING) == chain


def test_unsigned_token_without_keys_round_trips() -> None:
    chain = sample_chain()
    token = encode(chain, None)
    header, _payload, signature = token.split(".")
    assert json.loads(base64.urlsafe_b64decode(header + "==")) == {"alg": "none"}
    assert signature == ""
    assert decode(token, None) == chain


def test_without_keys_a_signed_token_is_read_as_it_is() -> None:
    chain = sample_chain()
    assert decode(encode(chain, KEYRING), None) == chain


def test_token_length_is_known_before_signing_and_matches() -> None:
    for keyring in (KEYRING, None):
        for hops in [(Hop("a"),), (Hop("planner", "plan"), Hop("bücher", "préis")), (Hop("x" * 700, "y"),)]:
            chain = sample_chain(*hops)
            token = ChainToken(chain, keyring)
            assert token.length == len(str(token))
            longer = token.extended(Hop("weather", "forecast"), keyring)
            assert longer.length == len(str(longer))
            assert decode(str(longer), keyring) == chain.extended(Hop("weather", "forecast"))


def test_token_signs_lazily_once_and_keeps_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    original = keys_module._Key.sign

    def counting(self: Any, message: bytes) -> bytes:
        calls.append(message)
        return original(self, message)

    monkeypatch.setattr(keys_module._Key, "sign", counting)
    token = ChainToken(sample_chain(), KEYRING)
    nested = token.extended(Hop("fx"), KEYRING).extended(Hop("tax"), KEYRING)
    assert calls == []  # making and extending tokens signs nothing
    text = str(nested)
    assert len(calls) == 1
    assert str(nested) is text  # kept, not signed again
    assert len(calls) == 1
    assert decode(text, KEYRING).agents == ("planner", "budget", "fx", "tax")
    assert "ChainToken(" in repr(nested)
    assert text not in repr(nested)


@FUZZ
@given(
    hops=st.lists(st.tuples(NAME, st.none() | NAME), min_size=1, max_size=8),
    workspace=st.text(min_size=1, max_size=20),
    issued=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    ttl=st.floats(min_value=0.001, max_value=1e6, allow_nan=False),
    signed_with_key=st.booleans(),
)
def test_any_chain_round_trips_and_its_length_is_exact(
    hops: list[tuple[str, str | None]], workspace: str, issued: float, ttl: float, signed_with_key: bool
) -> None:
    keyring = KEYRING if signed_with_key else None
    chain = Chain(tuple(Hop(a, s) for a, s in hops), ROOT, workspace, issued, issued + ttl)
    token = ChainToken(chain, keyring)
    text = str(token)
    assert token.length == len(text)
    assert text.isascii()
    assert decode(text, keyring) == chain


# -- keys -------------------------------------------------------------------------------------------


def test_keyring_parse_reads_kid_secret_pairs_in_order() -> None:
    first, second = os.urandom(32), os.urandom(40)
    keyring = Keyring.parse(f" new:{b64(first)} , old:{b64(second)},")
    assert keyring.kids == ("new", "old")
    assert keyring == Keyring({"new": first, "old": second})
    assert keyring.signing.kid == "new"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "at least one key"),
        ("k1", "kid:secret"),
        ("k1:" + b64(b"short"), "at least 32 bytes"),
        ("k1:not*base64!", "base64url"),
        ("bad kid:" + b64(SECRET), "key id"),
        ("k1:" + b64(SECRET) + ",k1:" + b64(OTHER_SECRET), "twice"),
        (":" + b64(SECRET), "key id"),
    ],
)
def test_keyring_parse_rejects_bad_text_with_a_clear_error(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="keys") as err:
        Keyring.parse(text)
    assert fragment in str(err.value)


def test_keyring_parse_accepts_padded_base64url() -> None:
    # base64.urlsafe_b64encode(os.urandom(32)) -- the obvious way to make a key -- ends with '='.
    padded = base64.urlsafe_b64encode(SECRET).decode()
    assert padded.endswith("=")
    assert Keyring.parse(f"k1:{padded}") == KEYRING


@pytest.mark.parametrize(
    "keys",
    [
        {},
        {"k1": b"short"},
        {"k1": "a string, not bytes, of more than 32 characters"},
        {"": SECRET},
        {"x" * 65: SECRET},
        {"with space": SECRET},
    ],
)
def test_keyring_rejects_bad_mappings(keys: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="keys"):
        Keyring(keys)


def test_keyring_never_shows_a_secret() -> None:
    secret = b"\x01" * 32
    keyring = Keyring({"k1": secret})
    assert "k1" in repr(keyring)
    assert b64(secret) not in repr(keyring)
    assert repr(secret) not in repr(keyring)


def test_generate_key_makes_a_working_key() -> None:
    kid, secret = generate_key()
    assert re.fullmatch(r"[A-Za-z0-9._~-]{1,64}", kid)
    keyring = Keyring.parse(f"{kid}:{secret}")
    assert len(base64.urlsafe_b64decode(secret + "=" * (-len(secret) % 4))) == 32
    chain = sample_chain()
    assert decode(encode(chain, keyring), keyring) == chain
    assert generate_key("mine")[0] == "mine"
    assert generate_key()[1] != generate_key()[1]


def test_rotation_first_key_signs_every_key_verifies() -> None:
    old, new = os.urandom(32), os.urandom(32)
    before = Keyring({"old": old})
    during = Keyring({"new": new, "old": old})
    after = Keyring({"new": new})
    chain = sample_chain()
    minted_before = encode(chain, before)
    minted_during = encode(chain, during)
    assert jwt.get_unverified_header(minted_during)["kid"] == "new"
    assert decode(minted_before, during) == chain  # old tokens still verify while both are listed
    assert decode(minted_during, during) == chain
    assert decode(minted_during, after) == chain
    with pytest.raises(InvalidToken, match="unknown key id 'new'"):
        decode(minted_during, before)
    with pytest.raises(InvalidToken, match="unknown key id 'old'"):
        decode(minted_before, after)


def test_same_kid_with_another_secret_is_a_bad_signature() -> None:
    token = encode(sample_chain(), Keyring({"k1": OTHER_SECRET}))
    with pytest.raises(InvalidToken, match="signature"):
        decode(token, KEYRING)


# -- interop with PyJWT ---------------------------------------------------------------------------------


def test_pyjwt_verifies_a_guard_token() -> None:
    chain = sample_chain()
    token = encode(chain, KEYRING)
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["v"] == 1
    assert claims["root"] == chain.root
    assert claims["ws"] == chain.workspace
    assert claims["iat"] == chain.issued_at
    assert claims["exp"] == chain.expires_at
    assert claims["hops"] == [["planner", "plan"], ["budget", None]]
    assert jwt.get_unverified_header(token) == {"alg": "HS256", "kid": "k1", "typ": "JWT"}
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, OTHER_SECRET, algorithms=["HS256"])


def test_guard_accepts_a_pyjwt_token() -> None:
    now = int(time.time())
    claims = good_claims(iat=now, exp=now + 300, extra="more claims may be added")
    token = jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "k1"})
    chain = decode(token, KEYRING)
    assert chain.hops == (Hop("planner", "plan"), Hop("budget", None))
    assert (chain.root, chain.workspace, chain.issued_at, chain.expires_at) == (
        ROOT,
        "default",
        now,
        now + 300,
    )
    # PyJWT orders the header differently unless asked: the guard reads any header layout.
    unsorted = jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "k1"}, sort_headers=False)
    assert decode(unsorted, KEYRING) == chain


# -- every bad token ----------------------------------------------------------------------------------

GOOD = signed(good_claims())


def _flip(text: str, index: int) -> str:
    return text[:index] + ("A" if text[index] != "A" else "B") + text[index + 1 :]


def _without(name: str) -> dict[str, Any]:
    claims = good_claims()
    del claims[name]
    return claims


# Tokens refused with and without keys: they are not a chain at all.
MALFORMED: dict[str, object] = {
    "empty": "",
    "one segment": "abc",
    "two segments": "abc.def",
    "four segments": GOOD + ".x",
    "bad base64 header": "!!!." + GOOD.split(".", 1)[1],
    "header not json": b64(b"{nope") + "." + GOOD.split(".", 1)[1],
    "header a list": b64json(["HS256"]) + "." + GOOD.split(".", 1)[1],
    "non-ascii": GOOD[:10] + "é" + GOOD[11:],
    "non-ascii appended": GOOD + "ü",
    "overlong": signed(good_claims(pad="x" * MAX_TOKEN_LENGTH)),
    "not a string (None)": None,
    "not a string (bytes)": GOOD.encode(),
    "not a string (int)": 42,
}

# Claims that are not a chain: refused signed with keys, and unsigned without keys.
BAD_CLAIMS: dict[str, object] = {
    "bad base64": "$$$",
    "impossible base64 length": "A",
    "not json": b"{nope",
    "not utf-8": b"\xff\xfe\x00",
    "a list": [1, 2],
    "deeply nested": b"[" * 2000,
    "missing v": _without("v"),
    "missing root": _without("root"),
    "missing ws": _without("ws"),
    "missing iat": _without("iat"),
    "missing exp": _without("exp"),
    "missing hops": _without("hops"),
    "v is 2": good_claims(v=2),
    "v is a string": good_claims(v="1"),
    "v is true": good_claims(v=True),
    "root uppercase": good_claims(root=ROOT.upper()),
    "root short": good_claims(root="abc"),
    "root a number": good_claims(root=12345),
    "ws empty": good_claims(ws=""),
    "ws a number": good_claims(ws=5),
    "iat a string": good_claims(iat="now"),
    "iat null": good_claims(iat=None),
    "exp a bool": good_claims(exp=True),
    "exp NaN": good_claims(exp=math.nan),
    "exp Infinity": good_claims(exp=math.inf),
    "exp too large for a float": good_claims(exp=10**400),
    "hops empty": good_claims(hops=[]),
    "hops an object": good_claims(hops={"planner": "plan"}),
    "hops a string": good_claims(hops="planner"),
    "hop of one": good_claims(hops=[["planner"]]),
    "hop of three": good_claims(hops=[["planner", "plan", "x"]]),
    "hop agent empty": good_claims(hops=[["", None]]),
    "hop agent a number": good_claims(hops=[[1, None]]),
    "hop skill a number": good_claims(hops=[["planner", 5]]),
    "hop an object": good_claims(hops=[{"agent": "planner"}]),
}


def _segment(claims: object) -> str:
    if isinstance(claims, str):
        return claims  # already a (bad) segment
    return b64(claims) if isinstance(claims, bytes) else b64json(claims)


def _signed_segment(claims: object) -> str:
    head = b64json({"alg": "HS256", "kid": "k1", "typ": "JWT"})
    body = _segment(claims)
    signature = hmac.new(SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


# Tokens refused when keys are configured (without keys they are read as they are).
FORGED: dict[str, str] = {
    "unsigned (alg none)": unsigned(good_claims()),
    "alg none with a signature": b64json({"alg": "none"})
    + "."
    + GOOD.split(".", 2)[1]
    + "."
    + GOOD.split(".")[2],
    "alg none with kid": signed(good_claims(), header={"alg": "none", "kid": "k1"}),
    "alg HS512": jwt.encode(good_claims(), b"z" * 64, algorithm="HS512", headers={"kid": "k1"}),
    "alg hs256 lowercase": signed(good_claims(), header={"alg": "hs256", "kid": "k1"}),
    "no kid": signed(good_claims(), header={"alg": "HS256"}),
    "kid a number": signed(good_claims(), header={"alg": "HS256", "kid": 1}),
    "unknown kid": signed(good_claims(), header={"alg": "HS256", "kid": "k9"}),
    "bad signature": signed(good_claims(), secret=OTHER_SECRET),
    "signature flipped": _flip(GOOD, len(GOOD) - 5),
    "signature removed": GOOD.rsplit(".", 1)[0] + ".",
    "signature truncated": GOOD[:-4],
    "claims altered": GOOD.split(".")[0]
    + "."
    + b64json(good_claims(hops=[["planner", "plan"]]))
    + "."
    + GOOD.split(".")[2],
    "claims flipped": _flip(GOOD, len(GOOD.split(".")[0]) + 8),
    "truncated in claims": GOOD[: len(GOOD.split(".")[0]) + 20],
    "signed malformed claims": signed({"v": 1, "hops": "x"}),
    "signed claims a list": signed([1, 2, 3]),
}


@pytest.mark.parametrize("token", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize("keyring", [KEYRING, None], ids=["keys", "no keys"])
def test_malformed_token_is_invalid(token: object, keyring: Keyring | None) -> None:
    with pytest.raises(InvalidToken):
        decode(token, keyring)


@pytest.mark.parametrize("claims", BAD_CLAIMS.values(), ids=BAD_CLAIMS.keys())
def test_signed_bad_claims_are_invalid_with_keys(claims: object) -> None:
    with pytest.raises(InvalidToken, match=r"claim|version|JSON|base64|could not be read|hop"):
        decode(_signed_segment(claims), KEYRING)


@pytest.mark.parametrize("claims", BAD_CLAIMS.values(), ids=BAD_CLAIMS.keys())
def test_unsigned_bad_claims_are_invalid_without_keys(claims: object) -> None:
    with pytest.raises(InvalidToken):
        decode(f"{b64json({'alg': 'none'})}.{_segment(claims)}.", None)


@pytest.mark.parametrize("token", FORGED.values(), ids=FORGED.keys())
def test_forged_or_altered_token_is_invalid_with_keys(token: str) -> None:
    with pytest.raises(InvalidToken):
        decode(token, KEYRING)


def test_the_good_token_of_the_bad_cases_is_good() -> None:
    # The cases above are near-misses of this token: it must pass, or they prove nothing.
    assert decode(GOOD, KEYRING).agents == ("planner", "budget")
    assert decode(unsigned(good_claims()), None).agents == ("planner", "budget")
    assert decode(_signed_segment(good_claims()), KEYRING).agents == ("planner", "budget")


def test_invalid_token_is_a_value_error_with_a_message() -> None:
    with pytest.raises(ValueError, match="signature does not match"):
        decode(FORGED["bad signature"], KEYRING)
    with pytest.raises(InvalidToken, match="unsigned"):
        decode(FORGED["unsigned (alg none)"], KEYRING)
    with pytest.raises(InvalidToken, match="HS256"):
        decode(FORGED["alg HS512"], KEYRING)


# -- no input raises anything but InvalidToken ------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
CLAIM_VALUES = st.one_of(
    JSON,
    st.just(ROOT),
    st.lists(st.lists(st.none() | st.text(max_size=8) | st.integers(), max_size=3), max_size=4),
)


@st.composite
def near_valid_claims(draw: st.DrawFn) -> Any:
    """The good claims with some removed, retyped or added: what a buggy or hostile peer sends."""
    claims = good_claims()
    for name in draw(st.lists(st.sampled_from([*claims, "extra"]), max_size=4, unique=True)):
        action = draw(st.sampled_from(["drop", "replace"]))
        if action == "drop":
            claims.pop(name, None)
        else:
            claims[name] = draw(CLAIM_VALUES)
    return claims


@st.composite
def mutated_tokens(draw: st.DrawFn) -> str:
    """A valid token with one segment replaced, cut, or a character changed."""
    parts = GOOD.split(".")
    index = draw(st.integers(0, 2))
    how = draw(st.sampled_from(["replace", "cut", "char", "json"]))
    if how == "replace":
        parts[index] = draw(st.text(alphabet="ABCDEFabcdef0123456789-_=+/.", max_size=60))
    elif how == "cut":
        parts[index] = parts[index][: draw(st.integers(0, len(parts[index])))]
    elif how == "char" and parts[index]:
        at = draw(st.integers(0, len(parts[index]) - 1))
        parts[index] = parts[index][:at] + draw(st.characters()) + parts[index][at + 1 :]
    else:
        parts[index] = b64json(draw(JSON))
    return ".".join(parts)


ANY_TOKEN = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.text(alphabet="ABCDEFabcdef0123456789-_.", max_size=200),
    mutated_tokens(),
    near_valid_claims().map(signed),
    near_valid_claims().map(unsigned),
    JSON.map(signed),
    st.builds(lambda h, c: f"{b64json(h)}.{b64json(c)}.", JSON, JSON),
    JSON,
)


def _assert_well_formed(chain: Chain) -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", chain.root)
    assert isinstance(chain.workspace, str)
    assert chain.workspace
    assert chain.hops
    assert all(isinstance(h.agent, str) and h.agent for h in chain.hops)
    assert all(h.skill is None or isinstance(h.skill, str) for h in chain.hops)
    assert math.isfinite(chain.issued_at)
    assert math.isfinite(chain.expires_at)


@FUZZ
@given(token=ANY_TOKEN, with_keys=st.booleans())
def test_decode_raises_nothing_but_invalid_token(token: object, with_keys: bool) -> None:
    try:
        chain = decode(token, KEYRING if with_keys else None)
    except InvalidToken:
        return
    _assert_well_formed(chain)  # what passes is a real chain


@FUZZ
@given(claims=near_valid_claims())
def test_a_correctly_signed_token_is_a_chain_or_invalid(claims: Any) -> None:
    try:
        chain = decode(signed(claims), KEYRING)
    except InvalidToken:
        return
    _assert_well_formed(chain)


@pytest.mark.parametrize("keyring", [KEYRING, None], ids=["signed", "unsigned"])
@pytest.mark.parametrize("hop", [["\ud800", None], ["planner", "pl\udfffan"], ["pl\ud83dner", "plan"]])
def test_a_chain_with_a_lone_surrogate_in_a_name_is_refused(keyring: Keyring | None, hop: list[Any]) -> None:
    # JSON's \\ud800 escapes decode to a str no carrier, span exporter or log can encode: the token is
    # refused where it arrives, never accepted to fail at the next inject.
    claims = good_claims(hops=[["planner", "plan"], hop])
    token = jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "k1"})
    with pytest.raises(InvalidToken, match="unpaired surrogate"):
        decode(token, keyring)
    # Text outside ASCII that UTF-8 encodes is fine.
    decode(
        jwt.encode(
            good_claims(hops=[["plánner", "précis"]]), SECRET, algorithm="HS256", headers={"kid": "k1"}
        ),
        keyring,
    )


# -- headers and echoes (RFC 7515, docs/spec.md §3) ---------------------------------------------------


@pytest.mark.parametrize("keyring", [KEYRING, None], ids=["with keys", "without keys"])
def test_a_critical_header_extension_is_refused(keyring: Keyring | None) -> None:
    header = {"alg": "HS256", "kid": "k1", "typ": "JWT", "crit": ["exp"], "exp": 1}
    with pytest.raises(InvalidToken, match="critical extensions"):
        decode(signed(good_claims(), header=header), keyring)


@pytest.mark.parametrize(
    ("header", "claims"),
    [
        ({"alg": "HS256", "kid": "x" * 1000, "typ": "JWT"}, good_claims()),
        ({"alg": "HS256" + "y" * 1000, "kid": "k1"}, good_claims()),
        (None, good_claims(v="z" * 1000)),
    ],
    ids=["kid", "alg", "version"],
)
def test_text_the_sender_chose_is_quoted_cut_to_64_characters(
    header: dict[str, Any] | None, claims: Any
) -> None:
    with pytest.raises(InvalidToken) as refused:
        decode(signed(claims, header=header), KEYRING)
    message = str(refused.value)
    quoted = message[message.index("'") : message.rindex("…") + 1]
    assert len(quoted) == MAX_QUOTED
    assert len(message) < 200


@pytest.mark.parametrize(
    "times",
    [{"exp": 1e308}, {"iat": -1e300}, {"iat": 10.0, "exp": 5.0}, {"exp": 2.0**40}, {"iat": True}],
    ids=["exp 1e308", "iat -1e300", "exp before iat", "exp past 2242", "iat a bool"],
)
def test_impossible_times_are_invalid(times: dict[str, Any]) -> None:
    with pytest.raises(InvalidToken):
        decode(signed(good_claims(**times)), KEYRING)


# -- names ----------------------------------------------------------------------------------------

LOOK_ALIKES = {
    "plаnner": "mixes the letters of Cyrillic and Latin",  # a Cyrillic а
    "Ρlanner": "mixes the letters of Greek and Latin",  # a Greek capital rho
    "plan\u200dner": "is not printable",  # a zero-width joiner: invisible
    "plan\nner": "is not printable",
    "ｐｌａｎｎｅｒ": "is not in Unicode NFKC form",  # fullwidth: NFKC makes it "planner"
}


@pytest.mark.parametrize("name", sorted(LOOK_ALIKES))
def test_a_look_alike_or_invisible_name_in_a_chain_is_refused(name: str) -> None:
    claims = good_claims(hops=[["planner", "plan"], [name, None]])
    with pytest.raises(InvalidToken, match=LOOK_ALIKES[name]):
        decode(signed(claims), KEYRING)


@pytest.mark.parametrize("name", ["бюджет", "予算", "bücher", "Ελένη", "price list", "ask_budget-2"])
def test_names_of_one_script_and_any_printable_ascii_are_names(name: str) -> None:
    assert name_problem(name) is None
    chain = decode(signed(good_claims(hops=[[name, None]])), KEYRING)
    assert chain.hops == (Hop(name),)


@FUZZ
@given(st.text(min_size=1, max_size=20), st.none() | st.text(max_size=20))
def test_the_decoder_only_lets_through_names_the_guard_takes(agent: str, skill: str | None) -> None:
    token = signed(good_claims(hops=[[agent, skill]]))
    try:
        chain = decode(token, KEYRING)
    except InvalidToken:
        assert name_problem(agent) is not None or (skill is not None and name_problem(skill) is not None)
        return
    for hop in chain.hops:
        assert name_problem(hop.agent) is None
        assert hop.skill is None or name_problem(hop.skill) is None
