"""Token lengths known before encoding (``fits``, ``length``), the baggage limit, strict base64url."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

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
