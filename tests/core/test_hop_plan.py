"""The hop's hot path: its context equals the public API's, a repeated hop reuses its plan (verdict,
child token, attributes, child baggage) and never a stale one, extra attributes never win."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from opentelemetry import baggage, context, trace

import otel_guard
import otel_guard._context_slots
import otel_guard.guard
from otel_guard import DelegationRefused, Hop, delegate
from otel_guard.chain import ChainToken, decode
from tests.hop_spans import chain_of

CHAIN_KEY = "otel_guard.chain"
PARENT_MEMBERS = {"user.id": "u-1", "tenant": "acme", "session": "s 42"}
CUSTOM_KEY = context.create_key("test_hop_plan.custom")


@pytest.fixture(params=[True, False], ids=["fast context", "public API"])
def context_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        # Both readers of the flag: the context's reading (_context_slots) and making (guard).
        monkeypatch.setattr(otel_guard._context_slots, "FAST_CONTEXT", False)
        monkeypatch.setattr(otel_guard.guard, "FAST_CONTEXT", False)
    return bool(request.param)


@contextmanager
def _with_baggage(members: dict[str, str]) -> Iterator[None]:
    """Run a block with these baggage members added (and one non-baggage context value)."""
    ctx = context.set_value(CUSTOM_KEY, "kept")
    for name, value in members.items():
        ctx = baggage.set_baggage(name, value, ctx)
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


class _Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset


def _public_api_context(parent: context.Context, d: otel_guard.Delegation) -> context.Context:
    token = baggage.get_baggage(CHAIN_KEY, d.context)
    ctx = trace.set_span_in_context(d.span, parent)
    # The hop's span and token, which a hop made directly under that span reads (lean hop spans).
    ctx = context.set_value(otel_guard.guard._PREVIOUS_HOP, (d.span, token), ctx)
    return baggage.set_baggage(CHAIN_KEY, token, ctx)


# -- the context a hop makes ---------------------------------------------------------------------


def test_a_hop_context_equals_what_the_public_api_makes(key: Any, context_path: bool) -> None:
    with _with_baggage(PARENT_MEMBERS):
        parent_baggage = dict(baggage.get_all())
        outer_parent = context.get_current()
        with delegate("a", "s") as d:
            assert trace.get_current_span() is d.span
            assert d.span.is_recording()
            members = dict(baggage.get_all())
            token = members.pop(CHAIN_KEY)
            assert members == parent_baggage
            assert isinstance(token, ChainToken)
            assert decode(str(token), key.keyring()).hops == (Hop("a", "s"),)
            assert context.get_value(CUSTOM_KEY) == "kept"
            assert dict(context.get_current()) == dict(_public_api_context(outer_parent, d))
            inner_parent = context.get_current()
            for _ in range(3):  # the first makes the plan, the others reuse it
                with delegate("b") as inner:
                    assert trace.get_current_span() is inner.span
                    nested = dict(baggage.get_all())
                    assert decode(str(nested.pop(CHAIN_KEY)), key.keyring()).agents == ("a", "b")
                    assert nested == parent_baggage
                    assert dict(context.get_current()) == dict(_public_api_context(inner_parent, inner))
                assert context.get_current() is inner_parent
        assert dict(baggage.get_all()) == parent_baggage
        assert baggage.get_baggage(CHAIN_KEY) is None


def test_parent_baggage_that_changes_between_repetitions_is_carried(key: Any, context_path: bool) -> None:
    def members_inside() -> dict[str, object]:
        with delegate("tool", kind="tool"):
            members = dict(baggage.get_all())
        assert isinstance(members.pop(CHAIN_KEY), ChainToken)
        return members

    with delegate("planner"):
        assert members_inside() == {}
        with _with_baggage({"extra": "1"}):
            assert members_inside() == {"extra": "1"}
            assert members_inside() == {"extra": "1"}
            with _with_baggage({"extra": "2", "more": "x"}):
                assert members_inside() == {"extra": "2", "more": "x"}
            assert members_inside() == {"extra": "1"}
        assert members_inside() == {}  # never the child baggage made for another parent
        with _with_baggage({"extra": "3"}):
            assert members_inside() == {"extra": "3"}


# -- the plan of a repeated hop ------------------------------------------------------------------


def _decisions(metric_reader: Any, name: str) -> dict[tuple[Any, Any], int]:
    return {
        (attrs.get("otel_guard.decision"), attrs.get("otel_guard.reason")): int(point.value)
        for attrs, point in metric_reader.points("otel_guard.decisions")
        if attrs.get("gen_ai.agent.name") == name
    }


def test_a_repeated_hop_reuses_its_plan_and_every_hop_is_counted(
    spans: Any, metric_reader: Any, unique: Any
) -> None:
    a, b, c = unique("a"), unique("b"), unique("c")
    chains = []
    with delegate(a), delegate(b):
        for _ in range(50):
            with delegate(c, "work") as third:
                assert third.decision == "allow"
                chains.append(third.chain)
    assert all(chain is chains[0] for chain in chains)  # the same plan, the same child chain
    assert chains[0] is not None
    assert chains[0].agents == (a, b, c)
    made = spans.named(f"invoke_agent {c}")
    assert len(made) == 50
    assert len({s.context.span_id for s in made}) == 50
    # The same attributes but the tree's hop count, which every hop adds one to.
    budget = "otel_guard.budget.hops"
    assert [s.attributes[budget] for s in made] == list(range(3, 53))
    assert all({**s.attributes, budget: 0} == {**made[0].attributes, budget: 0} for s in made)
    assert made[0].attributes["otel_guard.chain.depth"] == 3
    assert _decisions(metric_reader, c) == {("allow", None): 50}
    assert _decisions(metric_reader, a) == {("allow", None): 1}
    assert _decisions(metric_reader, b) == {("allow", None): 1}


def test_a_settings_change_takes_effect_at_the_next_repetition(spans: Any) -> None:
    with delegate("a"), delegate("b"):
        for _ in range(3):
            with delegate("c") as third:
                assert third.decision == "allow"
        otel_guard.configure(max_depth=2)
        with pytest.raises(DelegationRefused) as refused, delegate("c"):
            pass
        assert refused.value.reason == "depth"
        otel_guard.configure(max_depth=10)
        with delegate("c") as again:
            assert again.decision == "allow"
    assert [s.attributes["otel_guard.decision"] for s in spans.named("invoke_agent c")] == [
        "allow",
        "allow",
        "allow",
        "refuse",
        "allow",
    ]


def test_every_first_hop_starts_a_chain_of_its_own_under_the_settings_in_force(spans: Any) -> None:
    """A first hop repeated (every agent run of a runtime starts a chain) shares what does not
    depend on its root with the last one, never its root, times, token or budget."""
    otel_guard.configure(ttl=60, max_hops=2)
    chains = []
    for _ in range(3):
        with delegate("planner", "plan") as first:
            assert first.chain is not None
            chains.append(first.chain)
            with delegate("budget"), pytest.raises(DelegationRefused) as refused, delegate("fx"):
                pass
            assert refused.value.reason == "budget"  # each tree has its own max_hops
        time.sleep(0.002)
    assert len({chain.root for chain in chains}) == 3
    assert all(chain.expires_at - chain.issued_at == 60 for chain in chains)
    assert len({chain.issued_at for chain in chains}) == 3
    otel_guard.configure(mode="observe", workspace="finance")
    with delegate("planner", "plan") as after:
        assert after.chain is not None
        assert after.chain.workspace == "finance"
    planner = spans.named("invoke_agent planner")
    assert [s.attributes["otel_guard.mode"] for s in planner] == ["enforce"] * 3 + ["observe"]
    assert [s.attributes["otel_guard.chain.root"] for s in planner[:3]] == [c.root for c in chains]
    for span in planner:
        assert span.attributes["otel_guard.chain.agents"] == ("planner",)
        assert span.attributes["otel_guard.skill"] == "plan"
        assert span.attributes["otel_guard.budget.hops"] == 1


def test_a_chain_that_expires_between_repetitions_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(otel_guard.guard, "time", clock)
    otel_guard.configure(ttl=60)
    with delegate("a"), delegate("b"):
        for _ in range(3):
            with delegate("c"):
                pass
        clock.offset = 59
        with delegate("c") as still:
            assert still.decision == "allow"
        clock.offset = 61
        for _ in range(2):  # and stays refused
            with pytest.raises(DelegationRefused) as refused, delegate("c"):
                pass
            assert refused.value.reason == "expired"


# -- what the hops after a first hop share -------------------------------------------------------


def _chain_token() -> ChainToken:
    token = baggage.get_baggage(CHAIN_KEY)
    assert isinstance(token, ChainToken)
    return token


def test_the_hops_after_a_first_hop_are_shared_by_every_chain_of_that_path(spans: Any) -> None:
    """Every agent run starts a chain and calls its tools from it: from the third run on, the tool
    hop (and the hop under it) is made from what the earlier chains of the same path decided; each
    tree keeps its own root, times, token and budget."""
    otel_guard.configure(max_hops=3)
    kins = []
    roots = []
    for _ in range(4):
        with delegate("planner"):
            planner_token = _chain_token()
            kins.append(planner_token.kin)
            with delegate("lookup", kind="tool") as tool:
                assert tool.chain is not None
                roots.append(tool.chain.root)
                assert tool.chain.root == planner_token.root
                with delegate("fx") as fx:
                    assert fx.chain is not None
                    assert fx.chain.agents == ("planner", "lookup", "fx")
                with pytest.raises(DelegationRefused) as refused, delegate("rates"):
                    pass
                assert refused.value.reason == "budget"  # the fourth hop of this tree
    assert len(set(roots)) == 4
    # The first run's chain has no shared hop behind it; every later one shares one, which holds
    # the tool hop decided in the second run (and the hop under it, decided in the third).
    assert kins[0] is None
    assert kins[1] is kins[2] is kins[3]
    assert kins[1] is not None
    shared_tool = kins[1][("lookup", None, "tool")]
    assert ("fx", None, "agent") in shared_tool.kin
    tools = spans.named("execute_tool lookup")
    assert [s.attributes["otel_guard.chain.root"] for s in tools] == roots
    assert [s.attributes["otel_guard.budget.hops"] for s in tools] == [2, 2, 2, 2]
    assert all(
        {**s.attributes, "otel_guard.chain.root": ""} == {**tools[0].attributes, "otel_guard.chain.root": ""}
        for s in tools
    )
    assert "otel_guard.chain.agents" not in tools[0].attributes  # nested in planner's span: lean
    assert chain_of(tools[0], spans) == (("planner", "lookup"), ("", ""))
    assert [s.attributes["otel_guard.chain.depth"] for s in spans.named("invoke_agent fx")] == [3] * 4
    assert [s.attributes["otel_guard.decision"] for s in spans.named("invoke_agent rates")] == ["refuse"] * 4


def test_a_shared_hops_token_is_the_token_of_its_own_chain(key: Any) -> None:
    """A first hop's token shares its agents, skills and size bound with the first one of its name;
    it signs, measures and decodes as a token made afresh for its chain, and so do its children."""
    for _ in range(3):
        with delegate("planner", "plan"):
            token = _chain_token()
            fresh = ChainToken(token.chain, key.keyring())
            assert (token.agents, token.skills, token.length) == (fresh.agents, fresh.skills, fresh.length)
            assert str(token) == str(fresh)
            assert decode(str(token), key.keyring()) == token.chain
            with delegate("lookup", kind="tool"):
                inner = _chain_token()
                assert inner.length == len(str(inner))
                chain = decode(str(inner), key.keyring())
                assert (chain.root, chain.agents, chain.skills) == (
                    token.root,
                    ("planner", "lookup"),
                    ("plan", ""),
                )


def test_a_shared_hop_sees_a_settings_change_and_never_shares_a_refusal(spans: Any) -> None:
    otel_guard.configure(mode="observe")
    for _ in range(3):
        with delegate("planner"), delegate("worker") as worker, delegate("planner") as again:
            assert worker.decision == "allow"
            assert again.decision == "would_refuse"
    otel_guard.configure(mode="enforce", max_depth=1)
    for _ in range(2):
        with delegate("planner"), pytest.raises(DelegationRefused) as refused, delegate("worker"):
            pass
        assert refused.value.reason == "depth"
    otel_guard.configure(mode="enforce", max_depth=5)
    for _ in range(3):
        with (
            delegate("planner"),
            delegate("worker"),
            pytest.raises(DelegationRefused) as cycle,
            delegate("planner"),
        ):
            pass
        assert cycle.value.reason == "cycle"
    again_spans = [
        s for s in spans.named("invoke_agent planner") if s.attributes["otel_guard.chain.depth"] == 3
    ]
    assert [s.attributes["otel_guard.decision"] for s in again_spans] == ["would_refuse"] * 3 + ["refuse"] * 3
    assert all(len(s.events) == 1 for s in again_spans)
    workers = spans.named("invoke_agent worker")
    assert [s.attributes["otel_guard.decision"] for s in workers] == ["allow"] * 3 + ["refuse"] * 2 + [
        "allow"
    ] * 3


def test_a_shared_hop_from_a_chain_that_expired_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(otel_guard.guard, "time", clock)
    otel_guard.configure(ttl=60)
    for _ in range(3):  # the tool hop is shared from the third chain on
        with delegate("planner"), delegate("lookup", kind="tool"):
            pass
    with delegate("planner"):
        assert _chain_token().kin is not None
        clock.offset = 61
        with pytest.raises(DelegationRefused) as refused, delegate("lookup", kind="tool"):
            pass
        assert refused.value.reason == "expired"
        clock.offset = -31  # and a chain from further ahead than the clock skew allows
        with pytest.raises(DelegationRefused) as future, delegate("lookup", kind="tool"):
            pass
        assert future.value.reason == "expired"
        clock.offset = 0
        with delegate("lookup", kind="tool") as tool:
            assert tool.decision == "allow"


# -- extra span attributes -----------------------------------------------------------------------

EXTRA = {"otel_guard.decision": "x", "otel_guard.chain.depth": 99, "custom": 1}


def test_extra_attributes_never_overwrite_the_guards_own(spans: Any) -> None:
    with delegate("root", attributes=EXTRA), delegate("mid"):
        for _ in range(3):  # a first hop, then the reused plan
            with delegate("leaf", attributes=EXTRA):
                pass
        with delegate("plain"):  # a hop without extras after hops with them
            pass
    for span in [spans.one("invoke_agent root"), *spans.named("invoke_agent leaf")]:
        assert span.attributes["custom"] == 1
        assert span.attributes["otel_guard.decision"] == "allow"
    assert spans.one("invoke_agent root").attributes["otel_guard.chain.depth"] == 1
    assert [s.attributes["otel_guard.chain.depth"] for s in spans.named("invoke_agent leaf")] == [3, 3, 3]
    assert "custom" not in spans.one("invoke_agent plain").attributes
    assert "custom" not in spans.one("invoke_agent mid").attributes


def test_extra_attributes_never_overwrite_a_refusal(spans: Any) -> None:
    with delegate("a"), pytest.raises(DelegationRefused), delegate("a", attributes=EXTRA):
        pass
    refused = [s for s in spans.named("invoke_agent a") if s.attributes["otel_guard.chain.depth"] == 2]
    assert len(refused) == 1
    assert refused[0].attributes["otel_guard.decision"] == "refuse"
    assert refused[0].attributes["otel_guard.reason"] == "cycle"
    assert refused[0].attributes["custom"] == 1


# -- what a Delegation tells -----------------------------------------------------------------------


def test_a_delegation_before_and_after_it_starts() -> None:
    with delegate("a", "s") as outer:
        d = delegate("b", "t")
        assert d.hop == Hop("b", "t")
        assert (d.chain, d.decision, d.context) == (None, None, None)
        assert d.span is trace.INVALID_SPAN
        ctx = d.start()
        try:
            assert d.hop == Hop("b", "t")
            assert d.chain is not None
            assert d.chain.hops == (Hop("a", "s"), Hop("b", "t"))
            assert outer.chain is not None
            assert d.chain.root == outer.chain.root
            assert d.decision == "allow"
            assert d.context is ctx
            assert trace.get_current_span(ctx) is d.span
            assert d.span.is_recording()
        finally:
            d.finish()
        assert not d.span.is_recording()


def test_a_refused_delegation_has_no_chain() -> None:
    with delegate("a", "s"):
        d = delegate("a", "s")
        with pytest.raises(DelegationRefused) as refused, d:
            pass
    assert refused.value.hop == d.hop == Hop("a", "s")
    assert d.chain is None
    assert d.decision == "refuse"
    assert d.context is None
    assert d.span is trace.INVALID_SPAN


def test_a_would_refuse_delegation_has_its_chain() -> None:
    otel_guard.configure(mode="observe")
    with delegate("a", "s"), delegate("a", "s") as d:
        assert d.decision == "would_refuse"
        assert d.chain is not None
        assert d.chain.agents == ("a", "a")


@pytest.mark.parametrize(
    ("agent", "skill", "fragment"),
    [
        ("bad\ud800", None, "is not printable text"),
        ("planner", "bad\udfff", "is not printable text"),
        ("planner", 5, "skill"),
    ],
)
def test_a_hop_whose_names_cannot_travel_is_a_clear_error_before_the_body(
    agent: str, skill: Any, fragment: str
) -> None:
    ran = []
    with (
        pytest.raises(ValueError, match=fragment),
        otel_guard.delegate("root"),
        otel_guard.delegate(agent, skill),
    ):
        ran.append(True)
    assert ran == []
