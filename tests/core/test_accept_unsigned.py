"""``accept_unsigned`` (docs/security.md, "Rolling keys out"): with keys, an unsigned chain that is
otherwise well formed is taken as it arrived and recorded as a would-refuse (``bad_signature``), in
enforce mode too; its hop is still decided (a cycle is refused) and counted; anything else that fails
verification is refused as before, in every mode.

These hops run in this process, the chain placed in the baggage as a carrier would put it;
tests/core/test_key_rollout.py has the same across processes, over HTTP.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from opentelemetry import propagate

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard.chain import Chain, Hop, Keyring, decode, encode, new_root

InBaggage = Callable[[object], AbstractContextManager[None]]
OTHER_SECRET = b"o" * 32


def chain_of(*agents: str, workspace: str = "default", age: float = 0.0, ttl: float = 300.0) -> Chain:
    issued = time.time() - age
    return Chain(tuple(Hop(agent) for agent in agents), new_root(), workspace, issued, issued + ttl)


def unsigned(*agents: str, **kwargs: Any) -> str:
    return encode(chain_of(*agents, **kwargs), None)


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode("ascii")


NONE_HEADER = b64('{"alg":"none"}')


def attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_with_keys_an_unsigned_chain_is_refused_without_accept_unsigned(
    key: Any, chain_in_baggage: InBaggage, mode: str
) -> None:
    """The finding: keys given to a service before its callers refuse every call, in observe mode too."""
    otel_guard.configure(mode=mode)
    with (
        chain_in_baggage(unsigned("planner")),
        pytest.raises(DelegationRefused) as refused,
        delegate("budget", receiving=True),
    ):
        pass
    assert refused.value.reason == "bad_signature"
    assert "unsigned" in str(refused.value)


@pytest.mark.parametrize("mode", ["enforce", "observe"])
@pytest.mark.parametrize("receiving", [False, True])
def test_accept_unsigned_takes_the_chain_as_it_arrived_as_a_would_refuse(
    key: Any,
    chain_in_baggage: InBaggage,
    spans: Any,
    metric_reader: Any,
    unique: Callable[[str], str],
    carrier_token: Callable[[dict[str, str]], str],
    mode: str,
    receiving: bool,
) -> None:
    otel_guard.configure(mode=mode, accept_unsigned="true")
    agent = unique("budget")
    sent = chain_of("planner", *([agent] if receiving else []))  # a caller's client may add the hop
    with chain_in_baggage(encode(sent, None)), delegate(agent, receiving=receiving) as hop:
        assert hop.decision == "would_refuse"
        assert otel_guard.current_chain() == hop.chain
        # Inside it, the chain is this process's: signed, and its hops decided as any.
        with delegate("fx", kind="tool") as tool:
            assert tool.decision == "allow"
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            carried = decode(carrier_token(carrier), key.keyring())
    assert hop.chain is not None
    assert hop.chain.root == sent.root
    assert hop.chain.issued_at == sent.issued_at
    assert hop.chain.agents == ("planner", agent)
    assert carried.agents == ("planner", agent, "fx")

    span = spans.one(f"invoke_agent {agent}")
    assert attributes(span)["otel_guard.decision"] == "would_refuse"
    assert attributes(span)["otel_guard.reason"] == "bad_signature"
    assert [event.name for event in span.events] == ["otel_guard.would_refuse"]
    message = str(dict(span.events[0].attributes or {})["otel_guard.message"])
    assert "unsigned but keys are configured" in message
    assert "accept_unsigned" in message
    counted = {
        (attrs.get("otel_guard.decision"), attrs.get("otel_guard.reason")): point.value
        for attrs, point in metric_reader.points("otel_guard.decisions")
        if attrs.get("gen_ai.agent.name") == agent
    }
    assert counted == {("would_refuse", "bad_signature"): 1}


def test_an_unsigned_chain_that_makes_a_cycle_is_refused_for_the_cycle(
    key: Any, chain_in_baggage: InBaggage
) -> None:
    otel_guard.configure(accept_unsigned=True)
    with (
        chain_in_baggage(unsigned("planner", "budget")),
        pytest.raises(DelegationRefused) as refused,
        delegate("planner"),
    ):
        pass
    assert refused.value.reason == "cycle"
    otel_guard.configure(mode="observe")  # a policy would-refuse keeps its own reason
    with chain_in_baggage(unsigned("planner", "budget")), delegate("planner") as hop:
        assert hop.decision == "would_refuse"
    assert hop._plan is not None
    assert hop._plan.verdict.reason == "cycle"


def test_an_unsigned_chain_too_deep_is_refused_for_its_depth(key: Any, chain_in_baggage: InBaggage) -> None:
    otel_guard.configure(accept_unsigned=True, max_depth=2)
    with chain_in_baggage(unsigned("a", "b")), pytest.raises(DelegationRefused) as refused, delegate("c"):
        pass
    assert refused.value.reason == "depth"


def refused_tokens(keyring: Keyring) -> dict[str, tuple[str, str]]:
    """Tokens no setting lets through, with the reason each is refused for."""
    good = encode(chain_of("planner"), keyring)
    header, claims, signature = good.split(".")
    altered = encode(chain_of("budget"), None).split(".")[1]  # other claims under planner's signature
    return {
        "altered": (f"{header}.{altered}.{signature}", "bad_signature"),
        "same key id, another secret": (
            encode(chain_of("planner"), Keyring({keyring.kids[0]: OTHER_SECRET})),
            "bad_signature",
        ),
        "unknown key id": (encode(chain_of("planner"), Keyring({"evil": OTHER_SECRET})), "bad_signature"),
        "signature stripped": (f"{header}.{claims}.", "bad_signature"),
        "alg none with a signature": (f"{NONE_HEADER}.{claims}.{signature}", "bad_signature"),
        "not a token": ("garbage", "bad_signature"),
        "unsigned, bad claims": (f"{NONE_HEADER}.{b64(json.dumps({'v': 1}))}.", "bad_signature"),
        "unsigned, expired": (unsigned("planner", age=400), "expired"),
        "unsigned, longer than ttl": (unsigned("planner", ttl=3600), "expired"),
        "unsigned, foreign": (unsigned("planner", workspace="elsewhere"), "foreign_workspace"),
    }


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_what_accept_unsigned_never_lets_through(key: Any, chain_in_baggage: InBaggage, mode: str) -> None:
    otel_guard.configure(mode=mode, accept_unsigned=True)
    for what, (token, reason) in refused_tokens(key.keyring()).items():
        for receiving in (False, True):
            with (
                chain_in_baggage(token),
                pytest.raises(DelegationRefused) as refused,
                delegate("budget", receiving=receiving),
            ):
                pass
            assert refused.value.reason == reason, what
        if reason == "bad_signature":
            with chain_in_baggage(token):
                assert otel_guard.current_chain() is None, what


def test_a_signed_chain_is_allowed_as_before(key: Any, chain_in_baggage: InBaggage) -> None:
    otel_guard.configure(accept_unsigned=True)
    with chain_in_baggage(encode(chain_of("planner"), key.keyring())), delegate("budget") as hop:
        assert hop.decision == "allow"


def test_without_keys_accept_unsigned_changes_nothing(chain_in_baggage: InBaggage) -> None:
    otel_guard.configure(accept_unsigned=True)
    with chain_in_baggage(unsigned("planner")), delegate("budget") as hop:
        assert hop.decision == "allow"


def test_in_off_mode_the_unsigned_chain_is_continued_unchecked(key: Any, chain_in_baggage: InBaggage) -> None:
    sent = chain_of("planner")
    otel_guard.configure(mode="off")
    with chain_in_baggage(encode(sent, None)), delegate("budget") as hop:
        assert hop.chain is not None
        assert hop.chain.root != sent.root
    otel_guard.configure(accept_unsigned=True)
    with chain_in_baggage(encode(sent, None)), delegate("budget") as hop:
        assert hop.decision == "allow"
        assert hop.chain is not None
        assert hop.chain.root == sent.root


def test_a_would_refuse_hop_is_never_reused_or_shared_as_allowed(
    key: Any, chain_in_baggage: InBaggage
) -> None:
    """Plans are kept on tokens and first hops share theirs (otel_guard/_plans.py): the same hop
    from another unsigned chain, from a signed one, or with no chain, is decided as what it is."""
    otel_guard.configure(accept_unsigned=True)
    decisions = []
    for _ in range(3):
        with delegate("budget") as first:  # no chain: a first hop, shared after the first time
            decisions.append(first.decision)
        text = unsigned("planner")
        for _ in range(2):  # the same text again: decided again, the same way
            with chain_in_baggage(text), delegate("budget") as hop:
                decisions.append(hop.decision)
                with delegate("fx", kind="tool") as tool:
                    decisions.append(tool.decision)
        with chain_in_baggage(encode(chain_of("planner"), key.keyring())), delegate("budget") as hop:
            decisions.append(hop.decision)
    assert decisions == ["allow", "would_refuse", "allow", "would_refuse", "allow", "allow"] * 3


def test_an_unsigned_hop_counts_against_its_tree(key: Any, chain_in_baggage: InBaggage) -> None:
    otel_guard.configure(accept_unsigned=True, max_hops=2)
    with chain_in_baggage(unsigned("planner")), delegate("budget") as hop:
        assert hop.decision == "would_refuse"
        assert attributes(hop.span)["otel_guard.budget.hops"] == 1
        with delegate("fx") as inner:
            assert attributes(inner.span)["otel_guard.budget.hops"] == 2
        with pytest.raises(DelegationRefused) as refused, delegate("tax"):
            pass
    assert refused.value.reason == "budget"


def test_current_chain_reads_an_unsigned_chain_only_with_accept_unsigned(
    key: Any, chain_in_baggage: InBaggage
) -> None:
    sent = chain_of("planner")
    with chain_in_baggage(encode(sent, None)):
        assert otel_guard.current_chain() is None
        otel_guard.configure(accept_unsigned=True)
        assert otel_guard.current_chain() == sent
