"""Token lengths known before encoding (``fits``, ``length``), the baggage limit, strict base64url."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import baggage
from test_chain import KEYRING, SECRET, b64, b64json, good_claims

import otel_guard
from otel_guard import DelegationRefused, current_chain, delegate
from otel_guard.chain import (
    MAX_TIME,
    MAX_TOKEN_LENGTH,
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    TransferHop,
    VerifiedTokens,
    decode,
    encode,
    name_problem,
    new_root,
)

CHAIN_KEY = "otel_guard.chain"
LONG_KID = Keyring({"a-much-longer-key-id.2026": b"k" * 32})

# -- fits() and length agree with the text ---------------------------------------------------------

AWKWARD = st.sampled_from(['"', "\\", "\x00", "\x01", "\x1f", "\x7f", "\n", "é", "中", "😀", "\u2028", "/"])
NAMES = st.one_of(
    st.text(min_size=1, max_size=12),
    st.lists(AWKWARD | st.characters(codec="utf-8"), min_size=1, max_size=20).map("".join),
    st.text(alphabet=AWKWARD, min_size=100, max_size=700),
)
# Hop names must be names the guard takes (chain.name_problem); the workspace is any text, so the
# awkward characters above (JSON's six-byte escapes among them) are still measured there.
HOP_NAMES = NAMES.filter(lambda name: name_problem(name) is None)
SKILLS = st.none() | HOP_NAMES
HOPS = st.builds(Hop, HOP_NAMES, SKILLS)
KEYRINGS = st.sampled_from([None, KEYRING, LONG_KID])
# The times a token may hold (seconds from 1970 to 2242: decode refuses others), in every float
# form JSON gives them: integers, fractions, subnormals, the bounds.
TIMES = st.floats(min_value=0.0, max_value=MAX_TIME) | st.sampled_from([0.0, 1e-310, MAX_TIME])


@st.composite
def chains(draw: st.DrawFn) -> Chain:
    root = draw(st.text(alphabet="0123456789abcdef", min_size=32, max_size=32))
    issued, expires = sorted((draw(TIMES), draw(TIMES)))  # exp before iat is refused too
    return Chain((draw(HOPS),), root, draw(NAMES), issued, expires)


def _check(make: Callable[[], ChainToken]) -> None:
    """``fits`` and ``length`` of fresh tokens from ``make`` against the text of another one."""
    true_length = len(str(make()))
    fresh = make()
    assert fresh.length == true_length
    assert len(str(fresh)) == true_length
    for limit in (true_length - 1, true_length, true_length + 1, MAX_TOKEN_LENGTH):
        assert make().fits(limit) == (true_length <= limit), limit
        probed = make()
        probed.fits(MAX_TOKEN_LENGTH)
        assert probed.fits(limit) == (true_length <= limit), limit  # also after an earlier fits()


LENGTHS = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@LENGTHS
@given(
    chain=chains(),
    keyring=KEYRINGS,
    extensions=st.lists(st.tuples(HOPS, KEYRINGS), max_size=4),
)
def test_fits_and_length_agree_with_the_text(
    chain: Chain, keyring: Keyring | None, extensions: list[tuple[Hop, Keyring | None]]
) -> None:
    def made(upto: int) -> Callable[[], ChainToken]:
        def make() -> ChainToken:
            token = ChainToken(chain, keyring)
            for hop, child_keyring in extensions[:upto]:
                token = token.extended(hop, child_keyring)
            return token

        return make

    for upto in range(len(extensions) + 1):
        _check(made(upto))
    text = encode(chain, keyring)
    if len(text) > MAX_TOKEN_LENGTH:
        return
    arrived = decode(text, keyring)

    def from_text(upto: int) -> Callable[[], ChainToken]:
        def make() -> ChainToken:
            token = ChainToken(arrived, keyring, text)
            for hop, child_keyring in extensions[:upto]:
                token = token.extended(hop, child_keyring)
            return token

        return make

    for upto in range(len(extensions) + 1):
        _check(from_text(upto))
    child = ChainToken(arrived, keyring, text)
    for hop, child_keyring in extensions:
        child = child.extended(hop, child_keyring)
        if child.fits(MAX_TOKEN_LENGTH):
            assert decode(str(child), child_keyring).hops == child.chain.hops


# -- a chain near the baggage limit ------------------------------------------------------------------


def _name_filling(margin: int, keyring: Keyring | None) -> str:
    """An agent name whose one-hop chain is about ``margin`` characters under the limit."""
    probe = ChainToken(Chain((Hop("x"),), new_root(), "default", 1.7e9 + 0.123456, 1.7e9 + 300.1234), keyring)
    n = (MAX_TOKEN_LENGTH - margin - probe.length) * 3 // 4
    return "x" * n


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_hop_over_the_limit_is_refused_near_it(key: Any, spans: Any, mode: str) -> None:
    otel_guard.configure(mode=mode)
    big = _name_filling(60, key.keyring())
    with delegate(big) as first:
        token = baggage.get_baggage(CHAIN_KEY)
        assert isinstance(token, ChainToken)
        assert MAX_TOKEN_LENGTH - 80 < len(str(token)) <= MAX_TOKEN_LENGTH
        for _ in range(2):  # the second is the reused plan
            with delegate("z") as small:
                assert small.decision == "allow"
                assert len(str(baggage.get_baggage(CHAIN_KEY))) <= MAX_TOKEN_LENGTH
            with pytest.raises(DelegationRefused) as refused, delegate("y" * 80):
                pass
            assert refused.value.reason == "chain_size"
            assert str(MAX_TOKEN_LENGTH) in str(refused.value)
        assert current_chain() == first.chain
    refusals = spans.named(f"invoke_agent {'y' * 80}")
    assert [s.attributes["otel_guard.reason"] for s in refusals] == ["chain_size", "chain_size"]


def test_in_off_mode_a_hop_over_the_limit_runs_and_carries_no_chain(key: Any, spans: Any) -> None:
    otel_guard.configure(mode="off")
    big = _name_filling(60, key.keyring())
    with delegate(big):
        for _ in range(2):
            with delegate("y" * 80) as over:
                assert over.decision == "allow"
                assert baggage.get_baggage(CHAIN_KEY) is None
                assert CHAIN_KEY not in baggage.get_all()
                assert current_chain() is None
                with delegate("next") as after:  # the next hop starts a chain of its own
                    assert after.chain is not None
                    assert after.chain.agents == ("next",)
            assert isinstance(baggage.get_baggage(CHAIN_KEY), ChainToken)
    assert {s.attributes["otel_guard.decision"] for s in spans.named(f"invoke_agent {'y' * 80}")} == {"allow"}


# -- base64url, strictly ------------------------------------------------------------------------------

HEAD = b64json({"alg": "HS256", "kid": "k1", "typ": "JWT"})


def _sign(head: str, body: str) -> str:
    signature = hmac.new(SECRET, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


def _claims_segment(char: str, length_mod_4: int) -> str:
    """A base64url claims segment of good claims that holds ``char`` and has this length mod 4."""
    for i in range(10_000):
        body = b64json(good_claims(ws=f"w{i}~~~???"))
        if char in body and len(body) % 4 == length_mod_4:
            return body
    raise AssertionError(f"no claims found with {char!r}")


@pytest.mark.parametrize(("urlsafe", "standard"), [("-", "+"), ("_", "/")])
def test_a_claims_segment_in_the_standard_alphabet_is_refused(urlsafe: str, standard: str) -> None:
    body = _claims_segment(urlsafe, 2)
    assert decode(_sign(HEAD, body), KEYRING).workspace.startswith("w")  # the url-safe text is good
    standard_body = body.replace(urlsafe, standard)
    for keyring in (KEYRING, None):
        with pytest.raises(InvalidToken, match="base64url"):
            decode(_sign(HEAD, standard_body), keyring)


@pytest.mark.parametrize("length_mod_4", [2, 3])
def test_a_padded_claims_segment_is_refused(length_mod_4: int) -> None:
    body = _claims_segment("", length_mod_4)
    assert decode(_sign(HEAD, body), KEYRING).workspace.startswith("w")
    padded = body + "=" * (4 - length_mod_4)
    for text in (padded, body + "=", padded + "=", body[:4] + "=" + body[4:]):
        for keyring in (KEYRING, None):
            with pytest.raises(InvalidToken, match="base64url"):
                decode(_sign(HEAD, text), keyring)


# -- a child of an arrived token: the arrived claims' text with one more hop -------------------------


def _claims_text(token: str) -> str:
    body = token.split(".")[1]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


SPELLINGS = {
    # How other signers may write the same claims: PyJWT, JSON's spaces and escapes, integer times.
    "pyjwt": lambda claims: jwt.encode(claims, SECRET, algorithm="HS256", headers={"kid": "k1"}),
    "spaces": lambda claims: _sign(HEAD, b64(json.dumps(claims, separators=(" , ", " : ")).encode())),
    "escapes": lambda claims: _sign(HEAD, b64(json.dumps(claims, ensure_ascii=True).encode())),
    "integer times": lambda claims: _sign(
        HEAD, b64(json.dumps({**claims, "iat": int(claims["iat"]), "exp": int(claims["exp"])}).encode())
    ),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_child_of_an_arrived_token_extends_its_claims_text(spelling: str) -> None:
    claims = good_claims(hops=[["plànner", "plan"], ["triage", None, "transfer"]], ws="wörk")
    arrived = SPELLINGS[spelling](claims)
    token = VerifiedTokens().verify(arrived, KEYRING)
    for hop in (Hop("budget", None), Hop("fx", "rate"), TransferHop("faq", None)):
        child = token.extended(hop, KEYRING)
        text = str(child)
        assert child.length == len(text)
        assert child.fits(len(text))
        assert not child.fits(len(text) - 1)
        assert decode(text, KEYRING) == token.chain.extended(hop)
        # The arrived text was extended, as it was spelled, not encoded again.
        assert _claims_text(text).startswith(_claims_text(arrived)[:-2])
        grandchild = child.extended(Hop("ledger"), None)
        assert decode(str(grandchild), None) == token.chain.extended(hop).extended(Hop("ledger"))


@pytest.mark.parametrize(
    "claims_json",
    [
        # Another claim than the six read: a later format's; the text is not extended, the chain is
        # encoded again (and the claim not carried on).
        lambda claims: json.dumps({**claims, "x": [1]}),
        # The hops not last.
        lambda claims: json.dumps(
            {"hops": claims["hops"], **{k: v for k, v in claims.items() if k != "hops"}}
        ),
        # A space after the hops' array.
        lambda claims: json.dumps(claims)[:-1] + " }",
    ],
)
def test_claims_that_do_not_end_in_their_hops_are_encoded_again(claims_json: Callable[[Any], str]) -> None:
    claims = good_claims()
    arrived = _sign(HEAD, b64(claims_json(claims).encode()))
    token = VerifiedTokens().verify(arrived, KEYRING)
    child = token.extended(Hop("budget"), KEYRING)
    text = str(child)
    assert decode(text, KEYRING) == token.chain.extended(Hop("budget"))
    assert _claims_text(text) == _claims_text(encode(token.chain.extended(Hop("budget")), KEYRING))


def test_a_duplicate_hops_claim_extends_the_one_every_reader_takes() -> None:
    claims = good_claims(hops=[["planner", None]])
    body = json.dumps(claims)[:-1] + ', "hops": [["concierge", null]]}'
    token = VerifiedTokens().verify(_sign(HEAD, b64(body.encode())), KEYRING)
    assert token.chain.agents == ("concierge",)  # the lexically last member (RFC 7519 §4)
    text = str(token.extended(Hop("budget"), KEYRING))
    assert jwt.decode(text, SECRET, algorithms=["HS256"])["hops"] == [["concierge", None], ["budget", None]]
    assert decode(text, KEYRING).agents == ("concierge", "budget")


def test_a_spaced_out_arrived_token_near_the_limit_is_measured_by_its_own_size() -> None:
    """The size bound ``fits`` checks first is the arrived text's own: a sender's spaces make the
    claims longer than this module's encoding of them, and a child must still never pass the limit."""
    claims = good_claims(hops=[["planner", None]])
    compact = json.dumps(claims, separators=(",", ":"))
    padding = (MAX_TOKEN_LENGTH - 100 - len(_sign(HEAD, b64(compact.encode())))) * 3 // 4
    arrived = _sign(HEAD, b64(("{" + " " * padding + compact[1:]).encode()))
    assert MAX_TOKEN_LENGTH - 110 < len(arrived) <= MAX_TOKEN_LENGTH - 90, len(arrived)
    token = VerifiedTokens().verify(arrived, KEYRING)
    child = token.extended(Hop("b" * 150), KEYRING)
    assert child.fits(MAX_TOKEN_LENGTH) == (len(str(child)) <= MAX_TOKEN_LENGTH)
    assert not child.fits(MAX_TOKEN_LENGTH)
