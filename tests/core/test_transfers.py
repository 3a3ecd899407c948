"""Transfers (docs/spec.md §9): a handoff is a hop of kind transfer; a hand-back is no cycle.

The rule (otel_guard.policy.waiting): in a chain ``h0 … hn`` arriving at a new hop ``h``, the agent of
place i waits unless place i+1 is a transfer, and the agent of the last place waits unless ``h`` is a
transfer; the cycle rule looks at waiting places only, the depth limits at every place. Tested as a
pure function against a plain oracle, on the wire (the token's third element), and through the guard
(spans, plans, refusals); ``otel-guard inspect`` shows a transfer.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_chain import KEYRING, ROOT, SECRET, b64json, good_claims, signed, unsigned

import otel_guard
from otel_guard import DelegationRefused, current_chain, delegate
from otel_guard.chain import (
    MAX_TOKEN_LENGTH,
    Chain,
    ChainToken,
    Hop,
    InvalidToken,
    Keyring,
    TransferHop,
    decode,
    encode,
    new_root,
)
from otel_guard.policy import Verdict, decide, integrity, waiting
from otel_guard.settings import Settings

NOW = 1_000_000.0
T = TransferHop


def chain(*hops: Hop | str) -> Chain:
    made = tuple(h if isinstance(h, Hop) else Hop(h) for h in hops)
    return Chain(made, ROOT, "default", NOW - 10, NOW + 290)


def verdict(arrival: Chain | None, hop: Hop, **given: Any) -> tuple[str, str | None]:
    result = decide(arrival, hop, Settings(**given), NOW)
    return result.outcome, result.reason


# -- the rule -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["agent_skill", "agent"])
def test_a_hand_back_by_transfers_is_no_cycle(rule: str) -> None:
    # triage → faq → triage by handoffs: the customer-service shape of the OpenAI Agents SDK.
    assert verdict(chain("triage", T("faq")), T("triage"), cycle_rule=rule) == ("allow", None)
    # ... and on to faq again, and a tool call of triage's after that.
    assert verdict(chain("triage", T("faq"), T("triage")), T("faq"), cycle_rule=rule) == ("allow", None)
    assert verdict(chain("triage", T("faq"), T("triage")), Hop("lookup"), cycle_rule=rule) == ("allow", None)


@pytest.mark.parametrize("rule", ["agent_skill", "agent"])
def test_a_return_to_an_agent_still_waiting_is_a_cycle(rule: str) -> None:
    # A call back: triage waits for faq's answer.
    assert verdict(chain("triage", "faq"), Hop("triage"), cycle_rule=rule) == ("refuse", "cycle")
    # A transfer into an agent that waits (triage called faq, faq hands off to triage).
    assert verdict(chain("triage", "faq"), T("triage"), cycle_rule=rule) == ("refuse", "cycle")
    # triage took control back by a transfer, then called a tool that calls triage.
    back = chain("triage", T("faq"), T("triage"), "lookup")
    assert verdict(back, Hop("triage"), cycle_rule=rule) == ("refuse", "cycle")
    # The agent in charge calls itself: it waits for itself.
    assert verdict(chain("triage", T("faq")), Hop("faq"), cycle_rule=rule) == ("refuse", "cycle")


def test_control_handed_back_to_an_agent_that_handed_off_is_not_waiting_for_anything() -> None:
    # faq was handed control and calls triage as a tool: triage handed off, it waits for nothing.
    assert verdict(chain("triage", T("faq")), Hop("triage")) == ("allow", None)
    # An agent handing off to itself (a new turn of its own) is no cycle either.
    assert verdict(chain("triage", T("faq")), T("faq")) == ("allow", None)


def test_waiting_places_as_the_docstring_states() -> None:
    calls = (Hop("a"), Hop("b"), Hop("c"))
    assert waiting(calls, Hop("d")) is calls
    assert waiting(calls, T("d")) == (Hop("a"), Hop("b"))
    mixed = (Hop("a"), T("b"), Hop("c"), T("d"))
    assert waiting(mixed, Hop("e")) == (Hop("b"), T("d"))
    assert waiting(mixed, T("e")) == (Hop("b"),)


def test_a_ping_pong_of_transfers_stops_at_max_name_depth() -> None:
    # Every place counts toward max_name_depth: triage stands at most 5 times.
    hops: list[Hop] = [Hop("triage")]
    while True:
        nxt = T("faq") if hops[-1].agent == "triage" else T("triage")
        outcome = verdict(chain(*hops), nxt, max_depth=64, observe_max_depth=64)
        if outcome != ("allow", None):
            break
        hops.append(nxt)
    assert outcome == ("refuse", "name_depth")
    assert [h.agent for h in hops].count("triage") == 5
    assert len(hops) == 10  # triage, faq, ... , faq: the sixth triage is refused


def test_a_ping_pong_stops_at_max_depth_first_with_the_defaults() -> None:
    hops = [Hop("triage"), T("faq"), T("triage"), T("faq"), T("triage"), T("faq"), T("triage"), T("faq")]
    assert verdict(chain(*hops), T("triage")) == ("refuse", "depth")
    assert verdict(chain(*hops[:-1]), T("faq")) == ("allow", None)


def test_observe_mode_records_a_transfer_ping_pong_past_its_limit_as_would_refuse() -> None:
    hops = [Hop("triage"), *[T("faq"), T("triage")] * 5]
    assert verdict(chain(*hops), T("faq"), mode="observe", max_depth=64, observe_max_depth=64) == (
        "would_refuse",
        "name_depth",
    )


def test_the_integrity_checks_do_not_look_at_kinds() -> None:
    arrival = Chain((Hop("triage"), T("faq")), ROOT, "elsewhere", NOW - 10, NOW + 290)
    assert verdict(arrival, T("triage"), mode="observe") == ("refuse", "foreign_workspace")
    expired = Chain((Hop("triage"), T("faq")), ROOT, "default", NOW - 400, NOW - 100)
    assert verdict(expired, T("triage"), mode="observe") == ("refuse", "expired")


# -- the rule against a plain oracle --------------------------------------------------------------


AGENTS = st.sampled_from(["a", "b", "c"])
SKILLS = st.sampled_from([None, "x", "y"])
CALLS = st.builds(Hop, AGENTS, SKILLS)
ANY_HOPS = CALLS | st.builds(TransferHop, AGENTS, SKILLS)
RULES = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["enforce", "observe"]),
        "cycle_rule": st.sampled_from(["agent_skill", "agent", "none"]),
        "max_name_depth": st.integers(1, 6),
        "max_depth": st.integers(1, 9),
    }
)
PROPERTY = settings(max_examples=400, deadline=None, database=None)


def _decided_before_transfers(arrival: Chain, hop: Hop, given: Settings) -> tuple[str, str | None]:
    """The rules as they were before transfers (enforce and observe, a verified chain)."""
    hops = arrival.hops
    standing = [h.agent for h in hops].count(hop.agent)
    reason = None
    if (given.cycle_rule == "agent" and standing) or (
        given.cycle_rule == "agent_skill" and standing and hop in hops
    ):
        reason = "cycle"
    elif standing >= given.max_name_depth:
        reason = "name_depth"
    elif len(hops) >= given.max_depth:
        reason = "depth"
    return _outcome(reason, arrival, given)


def _decided_plainly(arrival: Chain, hop: Hop, given: Settings) -> tuple[str, str | None]:
    """The transfer rule spelt out place by place."""
    hops = arrival.hops
    waits = []
    for i, place in enumerate(hops):
        after = hops[i + 1] if i + 1 < len(hops) else hop
        if after.kind != "transfer":
            waits.append((place.agent, place.skill))
    reason = None
    if (given.cycle_rule == "agent" and hop.agent in [agent for agent, _ in waits]) or (
        given.cycle_rule == "agent_skill" and (hop.agent, hop.skill) in waits
    ):
        reason = "cycle"
    elif sum(1 for place in hops if place.agent == hop.agent) >= given.max_name_depth:
        reason = "name_depth"
    elif len(hops) >= given.max_depth:
        reason = "depth"
    return _outcome(reason, arrival, given)


def _outcome(reason: str | None, arrival: Chain, given: Settings) -> tuple[str, str | None]:
    if reason is None:
        return "allow", None
    if given.mode == "observe":
        return ("refuse", "observe_ceiling") if len(arrival.hops) >= 32 else ("would_refuse", reason)
    return "refuse", reason


@PROPERTY
@given(hops=st.lists(CALLS, min_size=1, max_size=9), hop=CALLS, rules=RULES)
def test_a_chain_of_calls_only_is_decided_exactly_as_before(
    hops: list[Hop], hop: Hop, rules: dict[str, Any]
) -> None:
    given_settings = Settings(**rules)
    arrival = chain(*hops)
    result = decide(arrival, hop, given_settings, NOW)
    assert (result.outcome, result.reason) == _decided_before_transfers(arrival, hop, given_settings)
    if result.reason == "cycle":  # the message too: a chain of calls prints as it always did
        assert " → ".join(h.agent for h in hops) in result.message
        assert "⇒" not in result.message


@PROPERTY
@given(hops=st.lists(ANY_HOPS, min_size=1, max_size=9), hop=ANY_HOPS, rules=RULES)
def test_any_chain_is_decided_as_the_rule_says(hops: list[Hop], hop: Hop, rules: dict[str, Any]) -> None:
    given_settings = Settings(**rules)
    arrival = chain(*hops)
    result = decide(arrival, hop, given_settings, NOW)
    assert (result.outcome, result.reason) == _decided_plainly(arrival, hop, given_settings)
    # A transfer never makes a hop refused where the same hop as a call was allowed.
    as_calls = chain(*[Hop(*h) for h in hops])
    if decide(as_calls, Hop(*hop), given_settings, NOW) == Verdict("allow"):
        assert result.outcome == "allow"


# -- on the wire ----------------------------------------------------------------------------------


def test_a_transfer_travels_as_a_third_element_and_reads_back_as_one() -> None:
    sent = Chain((Hop("triage"), T("faq", "refunds"), T("triage")), new_root(), "default", NOW, NOW + 300)
    token = encode(sent, KEYRING)
    claims = json.loads(_segment(token.split(".")[1]))
    assert claims["hops"] == [["triage", None], ["faq", "refunds", "transfer"], ["triage", None, "transfer"]]
    received = decode(token, KEYRING)
    assert [h.kind for h in received.hops] == ["call", "transfer", "transfer"]
    assert [type(h) for h in received.hops] == [Hop, TransferHop, TransferHop]
    assert received.path() == "triage ⇒ faq ⇒ triage"


def test_a_token_of_two_element_hops_stays_valid_and_all_calls() -> None:
    token = signed(good_claims())  # [["planner", "plan"], ["budget", None]]
    received = decode(token, KEYRING)
    assert received.hops == (Hop("planner", "plan"), Hop("budget"))
    assert [h.kind for h in received.hops] == ["call", "call"]
    assert received.path() == "planner → budget"


@pytest.mark.parametrize(
    "hop",
    [
        ["faq", None, "call"],
        ["faq", None, "Transfer"],
        ["faq", None, None],
        ["faq", None, "transfer", "again"],
        ["faq"],
        [None, None, "transfer"],
        ["", None, "transfer"],
        ["faq", 3, "transfer"],
    ],
)
def test_a_hop_of_any_other_shape_is_refused(hop: list[Any]) -> None:
    token = signed(good_claims(hops=[["triage", None], hop]))
    with pytest.raises(InvalidToken, match="token hop must be"):
        decode(token, KEYRING)
    with pytest.raises(InvalidToken, match="token hop must be"):
        decode(unsigned(good_claims(hops=[hop])), None)


def test_turning_a_call_into_a_transfer_breaks_the_signature() -> None:
    token = encode(chain("triage", "faq"), KEYRING)
    head, _, signature = token.split(".")
    altered = good_claims(hops=[["triage", None], ["faq", None, "transfer"]])
    with pytest.raises(InvalidToken, match="signature"):
        decode(f"{head}.{b64json(altered)}.{signature}", KEYRING)
    with pytest.raises(InvalidToken, match="unknown key id"):
        decode(signed(altered, b"o" * 32, {"alg": "HS256", "kid": "other", "typ": "JWT"}), KEYRING)


NAMES = st.text(min_size=1, max_size=12).filter(lambda n: n.isprintable() and n.isascii())


@settings(max_examples=150, deadline=None, database=None)
@given(
    first=st.builds(Hop, NAMES, st.none()) | st.builds(TransferHop, NAMES, st.none()),
    more=st.lists(
        st.builds(Hop, NAMES, st.none() | NAMES) | st.builds(TransferHop, NAMES, st.none() | NAMES),
        max_size=5,
    ),
    keyring=st.sampled_from([None, KEYRING]),
)
def test_lengths_known_before_encoding_agree_with_the_text(
    first: Hop, more: list[Hop], keyring: Keyring | None
) -> None:
    token = ChainToken(Chain((first,), new_root(), "default", NOW, NOW + 300), keyring)
    for hop in more:
        token = token.extended(hop, keyring)
        fresh = token.extended(Hop("probe"), keyring)  # the bound of a child never encoded
        assert fresh.fits(len(str(fresh)))
        assert not fresh.fits(len(str(fresh)) - 1)
    text = str(token)
    assert token.length == len(text)
    assert decode(text, keyring).hops == token.chain.hops
    assert [h.kind for h in decode(text, keyring).hops] == [h.kind for h in token.chain.hops]


def _segment(part: str) -> str:
    import base64

    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode()


# -- through the guard --------------------------------------------------------------------------------


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_triage_faq_triage_by_handoffs_runs_and_its_spans_say_so(spans: Any) -> None:
    with delegate("triage"), delegate("faq", transfer=True), delegate("triage", transfer=True):
        inner = current_chain()
    assert inner is not None
    assert [h.kind for h in inner.hops] == ["call", "transfer", "transfer"]
    triage_spans = spans.named("invoke_agent triage")
    first, back = sorted(triage_spans, key=lambda s: attrs(s)["otel_guard.chain.depth"])
    faq = spans.one("invoke_agent faq")
    assert attrs(first)["otel_guard.hop.kind"] == "call"
    assert "gen_ai.transfer.mode" not in attrs(first)
    for span in (faq, back):
        assert attrs(span)["otel_guard.hop.kind"] == "transfer"
        assert attrs(span)["gen_ai.transfer.mode"] == "pass_control"
        assert attrs(span)["otel_guard.decision"] == "allow"
    assert attrs(back)["otel_guard.name_depth"] == 2


def test_a_tool_hop_is_a_call(spans: Any) -> None:
    with delegate("triage"), delegate("search", kind="tool"):
        pass
    assert attrs(spans.one("execute_tool search"))["otel_guard.hop.kind"] == "call"
    with pytest.raises(ValueError, match="a transfer hands control to an agent"):
        delegate("search", kind="tool", transfer=True)


def test_a_call_back_is_still_refused_as_a_cycle() -> None:
    with (
        delegate("triage"),
        delegate("faq"),
        pytest.raises(DelegationRefused) as refused,
        delegate("triage", transfer=True),
    ):
        pass
    assert refused.value.reason == "cycle"
    assert refused.value.hop.kind == "transfer"
    assert str(refused.value) == "Delegation cycle: agent triage is already in chain triage → faq"


def test_a_guarded_ping_pong_of_handoffs_stops_at_max_name_depth() -> None:
    otel_guard.configure(max_depth=16, observe_max_depth=16)
    entered: list[str] = []

    def hand_over(to: str) -> None:
        with delegate(to, transfer=True):
            entered.append(to)
            hand_over("faq" if to == "triage" else "triage")

    def run() -> None:
        with delegate("triage"):
            entered.append("triage")
            hand_over("faq")

    with pytest.raises(DelegationRefused) as refused:
        run()
    assert refused.value.reason == "name_depth"
    assert entered.count("triage") == 5
    assert "triage ⇒ faq ⇒ triage" in str(refused.value)
    assert "max_name_depth" in str(refused.value)


def test_a_call_and_a_transfer_from_one_chain_keep_plans_of_their_own(spans: Any) -> None:
    # Inside faq, a transfer to faq (a new turn of its own) is allowed, a call of faq is a cycle:
    # whichever comes first, the other is decided as itself, never from the first one's plan.
    with delegate("faq"):
        for _ in range(2):
            with delegate("faq", transfer=True):
                pass
            with pytest.raises(DelegationRefused), delegate("faq"):
                pass
        # And a call and a transfer both allowed: each span says its own kind.
        for _ in range(2):
            with delegate("billing"):
                pass
            with delegate("billing", transfer=True):
                pass
    kinds = [attrs(s)["otel_guard.hop.kind"] for s in spans.named("invoke_agent billing")]
    assert kinds == ["call", "transfer", "call", "transfer"]


def test_a_first_hop_may_be_a_transfer_and_the_shared_plans_keep_kinds_apart(spans: Any) -> None:
    for _ in range(2):
        with delegate("intake", transfer=True):
            assert current_chain().hops[0].kind == "transfer"  # type: ignore[union-attr]
        with delegate("intake"):
            assert current_chain().hops[0].kind == "call"  # type: ignore[union-attr]
    kinds = [attrs(s)["otel_guard.hop.kind"] for s in spans.named("invoke_agent intake")]
    assert kinds == ["transfer", "call", "transfer", "call"]


def test_a_transfer_arriving_from_another_process_is_decided_as_one(
    chain_in_baggage: Callable[[object], Any], key: Any
) -> None:
    arrived = Chain((Hop("triage"), T("faq")), new_root(), "default", time.time(), time.time() + 300)
    with chain_in_baggage(encode(arrived, key.keyring())):
        with delegate("triage", transfer=True):
            assert [h.kind for h in current_chain().hops] == ["call", "transfer", "transfer"]  # type: ignore[union-attr]
        with pytest.raises(DelegationRefused, match="cycle"), delegate("faq"):
            pass
    # Forged (signed with another key) and expired chains of transfers are refused as any chain.
    forged = encode(arrived, Keyring({key.kid: b"x" * 32}))
    with (
        chain_in_baggage(forged),
        pytest.raises(DelegationRefused) as refused,
        delegate("triage", transfer=True),
    ):
        pass
    assert refused.value.reason == "bad_signature"
    old = Chain((Hop("triage"), T("faq")), new_root(), "default", time.time() - 400, time.time() - 100)
    with (
        chain_in_baggage(encode(old, key.keyring())),
        pytest.raises(DelegationRefused) as refused,
        delegate("triage", transfer=True),
    ):
        pass
    assert refused.value.reason == "expired"
    assert integrity(old, Settings(), time.time()) is not None


# -- otel-guard inspect -------------------------------------------------------------------------------


@pytest.mark.integration
def test_inspect_shows_a_transfer_hop(run_command: Callable[..., Any]) -> None:
    now = time.time()
    sent = Chain((Hop("triage"), T("faq", "refunds"), T("triage")), new_root(), "default", now, now + 300)
    keys = f"k1:{_b64(SECRET)}"
    completed = run_command(
        [str(Path(sys.executable).parent / "otel-guard"), "inspect", encode(sent, KEYRING)],
        OTEL_GUARD_KEYS=keys,
    )
    assert completed.returncode == 0, completed.stderr
    hop_lines = [line.strip() for line in completed.stdout.splitlines() if re.match(r"\s+\d+\. ", line)]
    assert hop_lines == ["1. triage", "2. faq  (skill refunds)  (transfer)", "3. triage  (transfer)"]
    assert len(encode(sent, KEYRING)) < MAX_TOKEN_LENGTH


def _b64(data: bytes) -> str:
    import base64

    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
