"""The claims' fast reader (otel_guard._claims_text) against ``json.loads``.

Whatever :func:`read_claims` reads must be exactly what ``json.loads`` gives for the same text (the
same keys, values and types); whatever it does not read goes to the JSON decoder unchanged, so a
token decodes to the same chain, or is refused with the same message, with the reader on and off.
The texts are the guard's own claims spelled every way JSON allows (spaces, escapes, ``\\u``
sequences and surrogates, keys repeated or reordered, integer, negative, huge and exponent times,
nesting) and then cut short or altered at a random place.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import otel_guard._claims_text as claims_text
from otel_guard.chain import (
    MAX_TIME,
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    TransferHop,
    _claims_to_chain,
    _decoded,
    encode,
)

KEYRING = Keyring({"k1": bytes(range(32))})
ROOT = "0123456789abcdef0123456789abcdef"
SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read(text: str) -> tuple[str, str, float, float, tuple[Hop, ...]] | None:
    return claims_text.read_claims(text, Hop, TransferHop)


def as_json(found: tuple[str, str, float, float, tuple[Hop, ...]]) -> dict[str, Any]:
    """What ``json.loads`` must give for a text :func:`read` read as ``found``."""
    root, workspace, issued_at, expires_at, hops = found
    return {
        "v": 1,
        "root": root,
        "ws": workspace,
        "iat": issued_at,
        "exp": expires_at,
        "hops": [[hop.agent, hop.skill, *(["transfer"] if type(hop) is TransferHop else [])] for hop in hops],
    }


def same_json(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == 1.0 == True`` is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_json(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def check_text(text: str) -> None:
    """The property: a text read is ``json.loads``' object, and reads to the chain the decoder's
    claims make."""
    found = read(text)
    if found is None:
        return
    loaded = json.loads(text)
    assert same_json(loaded, as_json(found)), (text, loaded, found)
    root, workspace, issued_at, expires_at, hops = found
    if 0.0 <= issued_at <= expires_at <= MAX_TIME:
        assert Chain(hops, root, workspace, issued_at, expires_at) == _claims_to_chain(loaded)


def signed(claims: bytes) -> str:
    """A token of ``claims`` (any bytes) signed with :data:`KEYRING`'s key."""
    key = KEYRING.signing
    assert key is not None
    payload = base64.urlsafe_b64encode(claims).rstrip(b"=").decode()
    signing_input = f"{key.header}.{payload}"
    signature = base64.urlsafe_b64encode(key.sign(signing_input.encode())).rstrip(b"=").decode()
    return f"{signing_input}.{signature}"


def decoded_both_ways(token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The token decodes to the same chain, text and size (or the same refusal) with the reader off."""

    def outcome() -> object:
        try:
            return _decoded(token, KEYRING)
        except InvalidToken as exc:
            return str(exc)

    with_reader = outcome()
    with monkeypatch.context() as patch:
        patch.setattr(claims_text, "READ", [False])
        without = outcome()
    assert with_reader == without


# -- what the texts are made of ------------------------------------------------------------------

PRINTABLE_ASCII = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=8)
ANY_TEXT = st.text(max_size=6)  # control characters, quotes, backslashes, non-ASCII
NAMES = st.one_of(
    PRINTABLE_ASCII, ANY_TEXT, st.sampled_from(["planner", "concierge", "a b", 'q"', "\\", "é"])
)
TIMES = st.one_of(
    st.floats(min_value=0, max_value=2.0**34, allow_nan=False),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0.0, 1764450000.5, 1e-05, 1e16, -0.0, 2.0**33, 2.0**33 + 1]),
)
SKILLS = st.one_of(st.none(), NAMES)
HOPS = st.lists(
    st.tuples(NAMES, SKILLS, st.sampled_from([None, "transfer", "call", 1])), min_size=0, max_size=4
)


@st.composite
def claims_texts(draw: st.DrawFn) -> str:
    """The claims of a chain, spelled one of the ways JSON allows, maybe cut or altered."""
    hops = [[agent, skill] if kind is None else [agent, skill, kind] for agent, skill, kind in draw(HOPS)]
    members: list[tuple[str, Any]] = [
        ("v", draw(st.sampled_from([1, 1, 1, 1.0, True, 2, "1"]))),
        ("root", draw(st.sampled_from([ROOT, ROOT.upper(), ROOT[:-1], ROOT + "0", ""]))),
        ("ws", draw(st.one_of(st.just("default"), NAMES))),
        ("iat", draw(TIMES)),
        ("exp", draw(TIMES)),
        ("hops", draw(st.one_of(st.just(hops), st.just([hops]), st.just({"a": hops}), st.just([])))),
    ]
    if draw(st.booleans()):
        members = draw(st.permutations(members))
    if draw(st.integers(0, 9)) == 0:
        members.insert(draw(st.integers(0, len(members))), draw(st.sampled_from(members)))  # a key twice
    if draw(st.integers(0, 9)) == 0:
        members.append(("extra", draw(st.one_of(st.integers(), NAMES, st.just([[1, [2]], {"x": None}])))))
    spaced = draw(st.booleans())
    ensure_ascii = draw(st.booleans())
    separators = (", ", ": ") if spaced else (",", ":")
    text = (
        "{"
        + separators[0].join(
            json.dumps(key, ensure_ascii=ensure_ascii)
            + separators[1]
            + json.dumps(value, ensure_ascii=ensure_ascii, separators=separators)
            for key, value in members
        )
        + "}"
    )
    cut = draw(st.integers(0, 4))
    if cut == 0 and text:
        text = text[: draw(st.integers(0, len(text) - 1))]  # truncated
    elif cut == 1:
        at = draw(st.integers(0, len(text)))
        inserted = draw(
            st.sampled_from(
                [
                    " ",
                    "\n",
                    '"',
                    "\\",
                    "\\u0041",
                    "\\ud800",
                    "\\udc00\\ud800",
                    "\\\\",
                    ",",
                    "]",
                    "[",
                    "}",
                    "e5",
                    "E-3",
                    "-",
                    "0",
                    ".",
                    "null",
                    "é",
                    "\x00",
                    "\x7f",
                    '"a":1,',
                ]
            )
        )
        text = text[:at] + inserted + text[at:]
    elif cut == 2 and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.characters()) + text[at + 1 :]
    return text


# -- the properties --------------------------------------------------------------------------------


@SETTINGS
@given(claims_texts())
@example(
    '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"default","iat":1.5,"exp":2.5,"hops":[["a",null]]}'
)
@example(
    '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1.5,"exp":2.5,"hops":[["a",""],["b","c","transfer"]]}'
)
@example(
    '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1.5,"exp":2.5,"hops":[["a","\\u0041"]]}'
)
@example(
    '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1.5,"exp":2.5,"hops":[["a","b"]],"v":1}'
)
@example('{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1,"exp":2.5,"hops":[["a","b"]]}')
@example(
    '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1.5e3,"exp":2.5,"hops":[["a","b"]]}'
)
@example('{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":-1.5,"exp":2.5,"hops":[["a","b"]]}')
@example('{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":01.5,"exp":2.5,"hops":[["a","b"]]}')
@example(
    '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1.5,"exp":2.5,"hops":[["a","b","call"]]}'
)
@example('{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"d","iat":1.5,"exp":2.5,"hops":[["a","b"]]} ')
def test_what_the_reader_reads_is_what_json_loads_reads(text: str) -> None:
    check_text(text)


@SETTINGS
@given(claims_texts())
def test_a_token_decodes_the_same_with_the_reader_off(text: str) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        decoded_both_ways(signed(text.encode("utf-8", "surrogatepass")), monkeypatch)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(NAMES, SKILLS, st.booleans()), min_size=1, max_size=5),
    st.one_of(st.just("default"), NAMES.filter(bool)),
    st.floats(min_value=0, max_value=2.0**33 - 600),
    st.floats(min_value=0, max_value=600),
)
def test_the_guards_own_tokens_decode_the_same_either_way(
    hops: list[tuple[str, str | None, bool]], workspace: str, issued_at: float, ttl: float
) -> None:
    """Tokens as the guard writes them, of any names: read by the reader where their text is its
    shape (printable ASCII), by the decoder elsewhere, to the same chain."""
    chain = Chain(
        tuple((TransferHop if transfer else Hop)(agent or "a", skill) for agent, skill, transfer in hops),
        ROOT,
        workspace,
        issued_at,
        issued_at + ttl,
    )
    token = encode(chain, KEYRING)
    claims = base64.urlsafe_b64decode(token.split(".")[1] + "==").decode("utf-8", "surrogatepass")
    check_text(claims)
    with pytest.MonkeyPatch.context() as monkeypatch:
        decoded_both_ways(token, monkeypatch)


def test_the_reader_reads_the_guards_own_claims() -> None:
    """The fast path is taken for a chain the guard writes (a test that it ever fires), to the chain
    the token holds, and a child of the token extends the text it arrived in."""
    chain = Chain(
        (Hop("planner", "plan"), TransferHop("faq", None)), ROOT, "default", 1764450000.25, 1764450300.25
    )
    token = str(ChainToken(chain, KEYRING))
    claims = base64.urlsafe_b64decode(token.split(".")[1] + "==").decode()
    found = read(claims)
    assert found is not None
    assert found == (ROOT, "default", 1764450000.25, 1764450300.25, chain.hops)
    assert [type(hop) for hop in found[4]] == [Hop, TransferHop]
    decoded, text, size = _decoded(token, KEYRING)
    assert decoded == chain
    assert (text, size) == (claims, len(claims))


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda c: c.replace('"v":1', '"v":2'), "token format version 2 is not 1"),
        (lambda c: c.replace("0123", "0X23", 1), "token claim 'root' must be 32 lowercase hex characters"),
        (lambda c: c.replace("1764450300.25", "1764449000.25"), "token claim 'exp' is before its 'iat'"),
        (lambda c: c.replace("1764450300.25", "9764450300.25"), "token claim 'exp' must be a time"),
        (lambda c: c.replace('["planner","plan"]', '["","plan"]'), "token hop must be"),
        (lambda c: c.replace('["planner","plan"]', '["planner","plan","call"]'), "token hop must be"),
    ],
)
def test_a_claim_the_reader_cannot_take_is_refused_as_before(change: Any, refusal: str) -> None:
    """What the reader does not take (or takes and the times refuse) is the decoder's, and refused
    with the decoder's message."""
    claims = (
        '{"v":1,"root":"0123456789abcdef0123456789abcdef","ws":"default","iat":1764450000.25,'
        '"exp":1764450300.25,"hops":[["planner","plan"]]}'
    )
    assert read(claims) is not None
    with pytest.raises(InvalidToken, match=refusal.replace("(", r"\(")):
        _decoded(signed(change(claims).encode()), KEYRING)
