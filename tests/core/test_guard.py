"""The hop (issue 2, item 4): delegate() in a process -- verify, decide, carry, restore.

Spans and metrics in detail are in ``test_telemetry.py``; ``@agentic`` in ``test_agentic.py``.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import baggage, context, propagate
from opentelemetry.trace import SpanKind, StatusCode

import otel_guard
from otel_guard import Chain, DelegationRefused, Hop, current_chain, delegate, name_depth
from otel_guard.chain import MAX_TOKEN_LENGTH, ChainToken, Keyring, encode, new_root
from tests.hop_spans import chain_of

CHAIN_KEY = "otel_guard.chain"
InBaggage = Callable[[object], AbstractContextManager[None]]


def attr(span: Any, name: str) -> Any:
    return span.attributes[name]


def mint(
    *agents: str,
    keyring: Keyring | None,
    workspace: str = "default",
    issued: float | None = None,
    ttl: float = 300,
) -> str:
    """A token for a chain of ``agents`` (skill-less), as another process would have sent it."""
    issued = time.time() if issued is None else issued
    chain = Chain(tuple(Hop(a) for a in agents), new_root(), workspace, issued, issued + ttl)
    return encode(chain, keyring)


# -- one hop, nested hops -----------------------------------------------------------------------------


def test_delegate_carries_the_chain_inside_and_restores_it_after() -> None:
    assert current_chain() is None
    assert name_depth("planner") == 0
    with delegate("planner", "plan") as outer:
        assert outer.decision == "allow"
        assert outer.chain is not None
        assert outer.chain.hops == (Hop("planner", "plan"),)
        assert current_chain() == outer.chain
        assert name_depth("planner") == 1
        with delegate("budget", "price") as inner:
            chain = current_chain()
            assert chain == inner.chain
            assert chain is not None
            assert chain.hops == (Hop("planner", "plan"), Hop("budget", "price"))
            assert chain.depth == 2
            assert chain.root == outer.chain.root
            assert chain.workspace == "default"
            assert chain.expires_at == outer.chain.expires_at
        assert current_chain() == outer.chain
    assert current_chain() is None
    assert baggage.get_baggage(CHAIN_KEY) is None


async def test_async_with_carries_the_chain_and_restores_it() -> None:
    async with delegate("planner", "plan") as outer:
        await asyncio.sleep(0)
        async with delegate("budget") as inner:
            await asyncio.sleep(0)
            assert current_chain() == inner.chain
            assert inner.chain is not None
            assert inner.chain.agents == ("planner", "budget")
        assert current_chain() == outer.chain
    assert current_chain() is None


def test_chain_lifetime_comes_from_the_ttl_setting() -> None:
    otel_guard.configure(ttl=42)
    before = time.time()
    with delegate("planner") as hop:
        assert hop.chain is not None
        assert before <= hop.chain.issued_at <= time.time()
        assert hop.chain.expires_at - hop.chain.issued_at == pytest.approx(42)


def test_context_restored_after_an_exception_and_the_exception_recorded(spans: Any) -> None:
    with pytest.raises(ValueError, match="boom"), delegate("planner"), delegate("budget"):
        raise ValueError("boom")
    assert current_chain() is None
    failed = spans.one("invoke_agent budget")
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes["exception.type"] == "ValueError"
    assert spans.one("invoke_agent planner").status.status_code is StatusCode.ERROR


def test_delegate_rejects_a_bad_agent_name_clearly() -> None:
    for bad in ["", None, 5]:
        with pytest.raises(ValueError, match="agent"):
            delegate(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kind"):
        delegate("planner", kind="robot")  # type: ignore[arg-type]


# -- refusal, observe, off --------------------------------------------------------------------------


def test_enforce_refuses_before_the_body_runs(spans: Any) -> None:
    ran: list[str] = []
    with delegate("planner", "plan"), delegate("budget", "price") as budget:
        with pytest.raises(DelegationRefused) as refused, delegate("planner", "plan"):
            ran.append("body")
        # The caller's context is intact after the refusal.
        assert current_chain() == budget.chain
    assert ran == []
    err = refused.value
    assert isinstance(err, RecursionError)
    assert err.reason == "cycle"
    assert err.code == "a2a_delegation_cycle"
    assert err.status == 409
    assert err.retryable is False
    assert err.hop == Hop("planner", "plan")
    assert err.chain is not None
    assert err.chain.agents == ("planner", "budget")  # the chain on arrival
    assert str(err) == "Delegation cycle: agent planner with skill plan is already in chain planner → budget"
    assert [attr(s, "otel_guard.decision") for s in spans.named("invoke_agent planner")] == [
        "refuse",
        "allow",
    ]


def test_observe_runs_the_body_and_records_would_refuse(spans: Any) -> None:
    otel_guard.configure(mode="observe")
    ran: list[Chain | None] = []
    with delegate("planner", "plan"), delegate("budget", "price"), delegate("planner", "plan") as again:
        ran.append(current_chain())
        assert again.decision == "would_refuse"
    assert ran
    assert ran[0] is not None
    assert ran[0].agents == ("planner", "budget", "planner")  # the hop is in the chain it carries on
    flagged = [
        s for s in spans.named("invoke_agent planner") if attr(s, "otel_guard.decision") == "would_refuse"
    ]
    assert len(flagged) == 1
    assert attr(flagged[0], "otel_guard.reason") == "cycle"
    assert attr(flagged[0], "otel_guard.mode") == "observe"
    assert [e.name for e in flagged[0].events] == ["otel_guard.would_refuse"]
    assert flagged[0].status.status_code is StatusCode.UNSET


def test_off_mode_checks_nothing_and_still_makes_spans(spans: Any) -> None:
    otel_guard.configure(mode="off")
    with delegate("a"), delegate("a"), delegate("a") as third:
        assert third.decision == "allow"
        assert third.chain is not None
        assert third.chain.agents == ("a", "a", "a")
    made = spans.named("invoke_agent a")
    assert len(made) == 3
    assert {attr(s, "otel_guard.decision") for s in made} == {"allow"}
    assert {attr(s, "otel_guard.mode") for s in made} == {"off"}
    assert all("otel_guard.reason" not in s.attributes and not s.events for s in made)


def test_off_mode_does_not_check_the_arriving_chain(key: Any, chain_in_baggage: InBaggage) -> None:
    otel_guard.configure(mode="off")
    with chain_in_baggage("garbage"), delegate("planner") as hop:
        assert hop.decision == "allow"
        assert hop.chain is not None
        assert hop.chain.agents == ("planner",)  # a new chain


def test_the_same_call_twice_in_sequence_is_not_a_cycle() -> None:
    # Planner asks Budget for a price, gets it, later asks again for another trip: legal work.
    otel_guard.configure(cycle_rule="agent")
    with delegate("planner"):
        for _ in range(3):
            with delegate("budget") as budget:
                assert budget.chain is not None
                assert budget.chain.agents == ("planner", "budget")


def test_a_to_b_to_a_is_refused_by_default() -> None:
    with delegate("a"), delegate("b"), pytest.raises(DelegationRefused, match="cycle"), delegate("a"):
        pass


def test_depth_limit_in_a_process() -> None:
    otel_guard.configure(max_depth=3)
    with (
        delegate("a"),
        delegate("b"),
        delegate("c"),
        pytest.raises(DelegationRefused) as refused,
        delegate("d"),
    ):
        pass
    assert refused.value.reason == "depth"
    assert refused.value.code == "a2a_delegation_depth"
    assert "the limit (max_depth) is 3" in str(refused.value)
    assert "agent d " in str(refused.value)


def test_per_agent_override_lets_one_agent_recurse() -> None:
    otel_guard.configure(overrides={"summarizer": {"cycle_rule": "none", "max_name_depth": 7}}, max_depth=10)
    entered = 0

    def summarize(level: int) -> None:
        nonlocal entered
        with delegate("summarizer"):
            entered += 1
            summarize(level + 1)

    with pytest.raises(DelegationRefused) as refused:
        summarize(0)
    assert entered == 7
    assert refused.value.reason == "name_depth"
    with delegate("writer"), pytest.raises(DelegationRefused, match="cycle"), delegate("writer"):
        pass


# -- chains that fail verification --------------------------------------------------------------------

OTHER = Keyring({"k1": b"o" * 32})  # same key id, another secret


def _bad_tokens(keyring: Keyring) -> dict[str, str]:
    good = mint("planner", keyring=keyring)
    head, claims, signature = good.split(".")
    # A character where all six bits count (the last one's low bits are padding: "AA" there may be
    # the same signature).
    altered = signature[:10] + ("B" if signature[10] == "A" else "A") + signature[11:]
    return {
        "garbage": "garbage",
        "empty": "",
        "signature altered": f"{head}.{claims}.{altered}",
        "claims altered": f"{head}.{mint('budget', keyring=keyring).split('.')[1]}.{signature}",
        "truncated": good[: len(good) // 2],
        "unsigned": mint("planner", keyring=None),
        "signed with another secret": mint("planner", keyring=OTHER),
        "unknown key id": mint("planner", keyring=Keyring({"k9": b"s" * 32})),
    }


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_chain_that_fails_verification_is_refused_in_enforce_and_observe(
    key: Any, chain_in_baggage: InBaggage, spans: Any, mode: str
) -> None:
    otel_guard.configure(mode=mode)
    for name, token in _bad_tokens(key.keyring()).items():
        spans.clear()
        ran = False
        with chain_in_baggage(token), pytest.raises(DelegationRefused) as refused, delegate("budget"):
            ran = True
        assert not ran, name
        assert refused.value.reason == "bad_signature", name
        assert refused.value.code == "a2a_delegation_invalid"
        assert refused.value.chain is None  # nothing on arrival could be trusted
        span = spans.one("invoke_agent budget")
        assert attr(span, "otel_guard.decision") == "refuse"
        assert attr(span, "otel_guard.reason") == "bad_signature"
        assert [e.name for e in span.events] == ["otel_guard.refused"]
    with chain_in_baggage(mint("planner", keyring=key.keyring())), delegate("budget") as ok:
        assert ok.chain is not None
        assert ok.chain.agents == ("planner", "budget")  # the near-misses above were near a good token


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_malformed_chain_is_refused_without_keys_too(chain_in_baggage: InBaggage, mode: str) -> None:
    otel_guard.configure(mode=mode)
    for token in ["garbage", "", "a.b.c", "eyJhbGciOiJub25lIn0.e30."]:
        with chain_in_baggage(token), pytest.raises(DelegationRefused) as refused, delegate("budget"):
            pass
        assert refused.value.reason == "bad_signature"


def test_a_baggage_value_that_is_not_a_string_is_refused(chain_in_baggage: InBaggage) -> None:
    with chain_in_baggage(12345), pytest.raises(DelegationRefused, match="verification"), delegate("budget"):
        pass


def test_a_bad_chain_is_never_treated_as_no_chain(key: Any, chain_in_baggage: InBaggage) -> None:
    with chain_in_baggage("garbage"):
        assert current_chain() is None  # nothing verified to report...
        with pytest.raises(DelegationRefused), delegate("planner"):  # ...and nothing starts afresh
            pass


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(token=st.text(max_size=120) | st.text(alphabet="abcdefABCDEF0123456789-_.", max_size=300))
def test_any_text_in_the_baggage_is_a_bad_signature_refusal(token: str) -> None:
    for mode in ("enforce", "observe"):
        otel_guard.configure(mode=mode, keys={"k1": b"s" * 32})
        ctx = baggage.set_baggage(CHAIN_KEY, token)
        attached = context.attach(ctx)
        try:
            with pytest.raises(DelegationRefused) as refused, delegate("budget"):
                pass
        finally:
            context.detach(attached)
        assert refused.value.reason == "bad_signature"


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_an_expired_chain_is_refused_in_enforce_and_observe(
    key: Any, chain_in_baggage: InBaggage, mode: str
) -> None:
    otel_guard.configure(mode=mode)
    stale = mint("planner", keyring=key.keyring(), issued=time.time() - 400, ttl=300)
    with chain_in_baggage(stale), pytest.raises(DelegationRefused) as refused, delegate("budget"):
        pass
    assert refused.value.reason == "expired"
    assert refused.value.code == "a2a_delegation_invalid"
    assert refused.value.chain is not None
    assert refused.value.chain.agents == ("planner",)


class _Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset


def test_a_chain_expires_inside_a_long_running_process(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr("otel_guard.guard.time", clock)
    otel_guard.configure(ttl=60)
    with delegate("planner"):
        with delegate("budget"):
            pass
        clock.offset = 61
        with pytest.raises(DelegationRefused) as refused, delegate("budget"):
            pass
    assert refused.value.reason == "expired"
    with delegate("planner") as fresh:  # a new chain gets a new lifetime
        assert fresh.decision == "allow"


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_foreign_workspace_chain_is_refused(key: Any, chain_in_baggage: InBaggage, mode: str) -> None:
    otel_guard.configure(mode=mode, workspace="travel")
    foreign = mint("planner", keyring=key.keyring(), workspace="finance")
    with chain_in_baggage(foreign), pytest.raises(DelegationRefused) as refused, delegate("budget"):
        pass
    assert refused.value.reason == "foreign_workspace"
    assert refused.value.code == "a2a_delegation_invalid"
    with chain_in_baggage(mint("planner", keyring=key.keyring(), workspace="travel")), delegate("budget"):
        pass


def test_without_keys_unsigned_chains_are_accepted(chain_in_baggage: InBaggage) -> None:
    with chain_in_baggage(mint("planner", keyring=None)), delegate("budget") as hop:
        assert hop.chain is not None
        assert hop.chain.agents == ("planner", "budget")


def test_with_keys_an_unsigned_chain_is_refused(key: Any, chain_in_baggage: InBaggage) -> None:
    with (
        chain_in_baggage(mint("planner", keyring=None)),
        pytest.raises(DelegationRefused) as refused,
        delegate("budget"),
    ):
        pass
    assert refused.value.reason == "bad_signature"
    assert "unsigned" in str(refused.value)


def test_key_rotation_across_processes(make_key: Callable[[str], Any]) -> None:
    old, new = make_key("old"), make_key("new")

    def send(keys: dict[str, bytes]) -> dict[str, str]:
        otel_guard.configure(keys=keys)
        carrier: dict[str, str] = {}
        with delegate("planner"):
            propagate.inject(carrier)
        return carrier

    def receive(keys: dict[str, bytes], carrier: dict[str, str]) -> str:
        otel_guard.configure(keys=keys)
        attached = context.attach(propagate.extract(carrier))
        try:
            with delegate("budget") as hop:
                assert hop.chain is not None
                assert hop.chain.agents == ("planner", "budget")
                return "allow"
        except DelegationRefused as refused:
            return refused.reason
        finally:
            context.detach(attached)

    # Step 1: every process knows both keys; the old one still signs.
    from_old = send({"old": old.secret, "new": new.secret})
    # Step 2: the sender moves the new key first; receivers still on step 1 accept it.
    from_new = send({"new": new.secret, "old": old.secret})
    assert receive({"old": old.secret, "new": new.secret}, from_new) == "allow"
    assert receive({"new": new.secret, "old": old.secret}, from_old) == "allow"
    # Step 3: the old key is dropped; a process that never learned the new key refuses.
    assert receive({"new": new.secret}, from_new) == "allow"
    assert receive({"new": new.secret}, from_old) == "bad_signature"
    assert receive({"old": old.secret}, from_new) == "bad_signature"


# -- parallel branches --------------------------------------------------------------------------------


async def test_asyncio_tasks_each_keep_their_own_chain() -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: dict[str, tuple[str, ...]] = {}
    both_inside = asyncio.Barrier(2)

    async def branch(agent: str) -> None:
        async with delegate(agent):
            await both_inside.wait()  # the two branches are open at the same time
            chain = current_chain()
            assert chain is not None
            seen[agent] = chain.agents
            async with delegate("fx"):  # the same helper from both branches is not a cycle
                pass

    async with delegate("planner") as planner:
        await asyncio.wait_for(asyncio.gather(branch("budget"), branch("weather")), timeout=10)
        assert current_chain() == planner.chain
    assert seen == {"budget": ("planner", "budget"), "weather": ("planner", "weather")}


def test_threads_with_a_copied_context_each_keep_their_own_chain() -> None:
    otel_guard.configure(cycle_rule="agent")
    both_inside = threading.Barrier(2, timeout=10)

    def branch(agent: str) -> tuple[tuple[str, ...], str]:
        with delegate(agent) as hop:
            both_inside.wait()
            chain = current_chain()
            assert chain is not None
            with delegate("fx"):
                pass
            assert hop.chain is not None
            return chain.agents, hop.chain.root

    with delegate("planner") as planner, ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(contextvars.copy_context().run, branch, agent) for agent in ("budget", "weather")
        ]
        results = [future.result(timeout=10) for future in futures]
        assert current_chain() == planner.chain
    assert planner.chain is not None
    assert results == [
        (("planner", "budget"), planner.chain.root),
        (("planner", "weather"), planner.chain.root),
    ]


def test_a_thread_started_below_threading_starts_a_new_chain() -> None:
    # The limit of carrying the context, stated: threading.Thread and ThreadPoolExecutor carry the
    # chain (tests/core/test_threads.py); a thread started with _thread directly does not.
    reported: queue.Queue[Chain] = queue.Queue()
    with delegate("planner") as planner:
        _thread.start_new_thread(lambda: reported.put(_enter_and_report("budget")), ())
        chain = reported.get(timeout=10)
    assert planner.chain is not None
    assert chain.agents == ("budget",)
    assert chain.root != planner.chain.root


def _enter_and_report(agent: str) -> Chain:
    with delegate(agent) as hop:
        assert hop.chain is not None
        return hop.chain


# -- the server side: receiving=True --------------------------------------------------------------


def _carrier_from(*hops: tuple[str, str | None]) -> dict[str, str]:
    """What a client process sends after entering ``hops`` (its instrumentation adds each hop)."""
    carrier: dict[str, str] = {}

    def enter(rest: tuple[tuple[str, str | None], ...]) -> None:
        if not rest:
            propagate.inject(carrier)
            return
        with delegate(*rest[0]):
            enter(rest[1:])

    enter(hops)
    return carrier


def _serve(carrier: dict[str, str], agent: str, skill: str | None = None, **kw: Any) -> Any:
    attached = context.attach(propagate.extract(carrier))
    try:
        with delegate(agent, skill, receiving=True, span_kind=SpanKind.SERVER, **kw) as hop:
            return hop
    finally:
        context.detach(attached)


def test_receiving_a_chain_that_ends_with_this_agent_does_not_add_it_twice(key: Any, spans: Any) -> None:
    carrier = _carrier_from(("planner", "plan"), ("budget", "price"))
    hop = _serve(carrier, "budget", "price")
    assert hop.decision == "allow"
    assert hop.chain.hops == (Hop("planner", "plan"), Hop("budget", "price"))
    server = [s for s in spans.named("invoke_agent budget") if s.kind is SpanKind.SERVER]
    assert len(server) == 1
    assert attr(server[0], "otel_guard.chain.depth") == 2
    assert attr(server[0], "otel_guard.name_depth") == 1


def test_receiving_with_no_skill_continues_the_hop_the_client_named(key: Any) -> None:
    hop = _serve(_carrier_from(("planner", "plan"), ("budget", "price")), "budget")
    assert hop.chain.hops[-1] == Hop("budget", "price")
    assert hop.chain.depth == 2


def test_receiving_a_chain_that_does_not_end_with_this_agent_adds_the_hop(key: Any) -> None:
    hop = _serve(_carrier_from(("planner", "plan")), "budget", "price")
    assert hop.chain.hops == (Hop("planner", "plan"), Hop("budget", "price"))
    other_skill = _serve(_carrier_from(("planner", "plan"), ("budget", "price")), "budget", "audit")
    assert other_skill.chain.agents == ("planner", "budget", "budget")


def test_receiving_with_no_chain_starts_one(key: Any) -> None:
    hop = _serve({}, "budget", "price")
    assert hop.chain.hops == (Hop("budget", "price"),)


def test_receiving_re_decides_the_hop_the_client_let_through(key: Any) -> None:
    # A client in observe mode sends a would-refuse hop; the server in enforce mode refuses it.
    otel_guard.configure(mode="observe", keys={key.kid: key.secret})
    carrier = _carrier_from(("planner", None), ("budget", None), ("planner", None))
    otel_guard.configure(mode="enforce")
    with pytest.raises(DelegationRefused) as refused:
        _serve(carrier, "planner")
    assert refused.value.reason == "cycle"
    assert "planner → budget" in str(refused.value)


def test_receiving_re_verifies_the_arriving_chain(key: Any, make_key: Callable[[str], Any]) -> None:
    carrier = _carrier_from(("planner", None), ("budget", None))
    otel_guard.configure(keys={"k1": make_key("k1").secret})  # the server holds another secret
    with pytest.raises(DelegationRefused) as refused:
        _serve(carrier, "budget")
    assert refused.value.reason == "bad_signature"


# -- the W3C baggage size limit -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_hop_whose_token_would_not_fit_the_baggage_is_refused(key: Any, spans: Any, mode: str) -> None:
    otel_guard.configure(mode=mode)
    huge = "x" * 3200
    with pytest.raises(DelegationRefused) as refused, delegate(huge):
        pass
    assert refused.value.reason == "chain_size"
    assert str(MAX_TOKEN_LENGTH) in str(refused.value)
    assert attr(spans.one(f"invoke_agent {huge}"), "otel_guard.reason") == "chain_size"


@pytest.mark.parametrize("signed_with_key", [True, False], ids=["keys", "no keys"])
def test_every_token_the_guard_lets_out_survives_the_baggage_propagator(
    make_key: Callable[[str], Any], signed_with_key: bool
) -> None:
    if signed_with_key:
        k = make_key("k1")
        otel_guard.configure(keys={k.kid: k.secret})
    outcomes: dict[int, str] = {}
    longest_sent = 0
    # Name lengths around the limit: every hop is refused, or its token crosses the propagator intact.
    for length in range(2780, 2950):
        try:
            with delegate("planner"), delegate("é" * 10 + "b" * length) as hop:
                carrier: dict[str, str] = {}
                propagate.inject(carrier)
                arrived = baggage.get_baggage(CHAIN_KEY, propagate.extract(carrier))
                assert arrived == str(baggage.get_baggage(CHAIN_KEY)), length
                longest_sent = max(longest_sent, len(arrived))
                assert hop.chain is not None
                outcomes[length] = "allow"
        except DelegationRefused as refused:
            outcomes[length] = refused.reason
    assert set(outcomes.values()) == {"allow", "chain_size"}  # the range crosses the limit
    first_refused = min(n for n, o in outcomes.items() if o == "chain_size")
    assert all(o == "allow" for n, o in outcomes.items() if n < first_refused)
    assert longest_sent > MAX_TOKEN_LENGTH - 4  # the largest token allowed was tried, and arrived


def test_the_token_length_the_guard_checks_is_the_length_it_sends(key: Any) -> None:
    with delegate("planner", "plan"), delegate("bücher", None):
        token = baggage.get_baggage(CHAIN_KEY)
        assert isinstance(token, ChainToken)
        assert token.length == len(str(token))


# -- what str(err) says ------------------------------------------------------------------------------


def _refusal(reason: str, key: Any, in_baggage: InBaggage) -> DelegationRefused:
    keyring = key.keyring()
    arriving = {
        "bad_signature": mint("planner", "budget", keyring=OTHER),
        "expired": mint("planner", "budget", keyring=keyring, issued=time.time() - 1000),
        "foreign_workspace": mint("planner", "budget", keyring=keyring, workspace="elsewhere"),
    }
    if reason in arriving:
        with in_baggage(arriving[reason]), pytest.raises(DelegationRefused) as refused, delegate("fx"):
            pass
        return refused.value
    otel_guard.configure(max_depth=3, max_name_depth=1, cycle_rule="agent_skill")
    last: dict[str, list[tuple[str, str | None]]] = {
        "cycle": [("planner", None)],
        "depth": [("tax", None), ("fx", None)],
        "name_depth": [("planner", "again")],
    }
    with pytest.raises(DelegationRefused) as refused:
        _enter([("planner", None), ("budget", None), *last[reason]])
    return refused.value


def _enter(hops: list[tuple[str, str | None]]) -> None:
    if hops:
        with delegate(*hops[0]):
            _enter(hops[1:])


ALL_REASONS = ["cycle", "depth", "name_depth", "expired", "bad_signature", "foreign_workspace"]


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_every_refusal_names_the_agent(reason: str, key: Any, chain_in_baggage: InBaggage) -> None:
    err = _refusal(reason, key, chain_in_baggage)
    assert err.reason == reason
    assert f"agent {err.hop.agent}" in str(err)


@pytest.mark.parametrize("reason", ["cycle", "depth", "name_depth", "expired", "foreign_workspace"])
def test_every_refusal_of_a_verified_chain_names_the_path(
    reason: str, key: Any, chain_in_baggage: InBaggage
) -> None:
    err = _refusal(reason, key, chain_in_baggage)
    assert err.chain is not None
    assert err.chain.path() in str(err)
    assert err.code == {"cycle": "a2a_delegation_cycle", "depth": "a2a_delegation_depth"}.get(
        reason, "a2a_delegation_depth" if reason == "name_depth" else "a2a_delegation_invalid"
    )


@pytest.mark.parametrize(("reason", "limit"), [("depth", "3"), ("name_depth", "1")])
def test_depth_refusals_name_the_limit(
    reason: str, limit: str, key: Any, chain_in_baggage: InBaggage
) -> None:
    err = _refusal(reason, key, chain_in_baggage)
    assert f"is {limit}" in str(err)


# -- tokens this process has verified before ------------------------------------------------------


def test_a_token_verified_once_is_not_accepted_after_the_key_changes(
    key: Any, make_key: Callable[[str], Any], chain_in_baggage: InBaggage
) -> None:
    arriving = mint("planner", keyring=key.keyring())
    with chain_in_baggage(arriving), delegate("budget") as first:
        assert first.decision == "allow"
    otel_guard.configure(keys={"k1": make_key("k1").secret})  # same key id, new secret
    with chain_in_baggage(arriving), pytest.raises(DelegationRefused) as refused, delegate("budget"):
        pass
    assert refused.value.reason == "bad_signature"


def test_a_token_verified_once_still_expires(
    key: Any, chain_in_baggage: InBaggage, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr("otel_guard.guard.time", clock)
    arriving = mint("planner", keyring=key.keyring(), ttl=60)
    with chain_in_baggage(arriving), delegate("budget"):
        pass
    clock.offset = 61
    with chain_in_baggage(arriving), pytest.raises(DelegationRefused) as refused, delegate("budget"):
        pass
    assert refused.value.reason == "expired"


def test_a_token_verified_once_is_checked_against_the_current_workspace(
    key: Any, chain_in_baggage: InBaggage
) -> None:
    arriving = mint("planner", keyring=key.keyring(), workspace="default")
    with chain_in_baggage(arriving), delegate("budget"):
        pass
    otel_guard.configure(workspace="finance")
    with chain_in_baggage(arriving), pytest.raises(DelegationRefused) as refused, delegate("budget"):
        pass
    assert refused.value.reason == "foreign_workspace"


def _received_after_sending(
    carrier_token: Callable[[dict[str, str]], str], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[str], Any]:
    """A hop sends its chain (injected into a carrier); returns the token, the texts the guard
    decoded since, and the chain sent."""
    carrier: dict[str, str] = {}
    with delegate("planner"), delegate("budget", kind="tool") as sender:
        propagate.inject(carrier)
    decoded: list[str] = []
    real = otel_guard.chain._decode  # what decode() and the verified tokens' cache both call

    def counting(text: object, keyring: Any) -> Any:
        decoded.append(str(text))
        return real(text, keyring)

    monkeypatch.setattr(otel_guard.chain, "_decode", counting)
    return carrier_token(carrier), decoded, sender.chain


def test_a_token_this_process_signed_is_not_verified_again(
    key: Any,
    chain_in_baggage: InBaggage,
    carrier_token: Callable[[dict[str, str]], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server in this process receiving the chain a client of it just sent (an MCP call over
    streams): its hop takes the signed token as verified, with the same chain and decision."""
    token, decoded, sent = _received_after_sending(carrier_token, monkeypatch)
    with chain_in_baggage(token), delegate("budget", kind="tool", receiving=True) as served:
        assert served.decision == "allow"
        assert served.chain == sent
    assert decoded == []


def test_a_token_this_process_signed_is_verified_after_the_key_changes(
    key: Any,
    make_key: Callable[[str], Any],
    chain_in_baggage: InBaggage,
    carrier_token: Callable[[dict[str, str]], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token, decoded, _ = _received_after_sending(carrier_token, monkeypatch)
    otel_guard.configure(keys={"k1": make_key("k1").secret})  # same key id, new secret
    with (
        chain_in_baggage(token),
        pytest.raises(DelegationRefused) as refused,
        delegate("budget", kind="tool", receiving=True),
    ):
        pass
    assert refused.value.reason == "bad_signature"
    assert decoded == [token]


def test_a_repeated_hop_is_decided_again_when_the_settings_change(spans: Any) -> None:
    """The guard reuses the decision and child chain of a hop repeated from one chain (an agent
    calling one tool again and again) only while the settings stay the same."""
    otel_guard.configure(mode="observe", cycle_rule="agent")
    with delegate("planner"):
        for _ in range(3):
            with delegate("budget"), delegate("planner") as inner:
                assert inner.decision == "would_refuse"
        otel_guard.configure(mode="enforce")
        with delegate("budget"), pytest.raises(DelegationRefused) as refused, delegate("planner"):
            pass
    assert refused.value.reason == "cycle"
    planner_spans = [s for s in spans.named("invoke_agent planner") if attr(s, "otel_guard.chain.depth") == 3]
    assert [attr(s, "otel_guard.decision") for s in planner_spans] == ["would_refuse"] * 3 + ["refuse"]
    assert len({attr(s, "otel_guard.chain.root") for s in planner_spans}) == 1


def test_a_repeated_hop_gets_a_span_of_its_own_each_time(spans: Any) -> None:
    with delegate("planner"):
        for _ in range(3):
            with delegate("search", kind="tool") as hop:
                assert hop.chain is not None
                assert hop.chain.agents == ("planner", "search")
    searches = spans.named("execute_tool search")
    assert len(searches) == 3
    assert len({s.context.span_id for s in searches}) == 3
    assert all(chain_of(s, spans)[0] == ("planner", "search") for s in searches)
    assert all("otel_guard.chain.agents" not in s.attributes for s in searches)  # nested: lean


@pytest.mark.parametrize("keys", [{"k1": b"s" * 32}, None], ids=["signed", "without keys"])
def test_a_chain_naming_a_lone_surrogate_is_refused_at_the_hop_not_at_the_next_inject(
    chain_in_baggage: InBaggage, keys: dict[str, bytes] | None
) -> None:
    import jwt

    if keys:
        otel_guard.configure(keys=keys)
    claims = {
        "v": 1,
        "root": "ab" * 16,
        "ws": "default",
        "iat": time.time(),
        "exp": time.time() + 60,
        "hops": [["\ud800", None]],
    }
    token = jwt.encode(claims, b"s" * 32, algorithm="HS256", headers={"kid": "k1"})
    with chain_in_baggage(token):
        with pytest.raises(DelegationRefused) as refused, delegate("budget"):
            propagate.inject({})  # never reached: the hop is refused on entry
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # and the context around it still injects
    assert refused.value.reason == "bad_signature"


def test_a_name_given_in_a_compatibility_form_is_the_same_agent() -> None:
    """Fullwidth ``ｐｌａｎｎｅｒ`` is ``planner`` (NFKC): it cannot slip past the cycle rule."""
    with (
        pytest.raises(DelegationRefused) as refused,
        delegate("planner"),
        delegate("budget"),
        delegate("ｐｌａｎｎｅｒ"),
    ):
        pass
    assert refused.value.reason == "cycle"
    assert refused.value.hop.agent == "planner"


@pytest.mark.parametrize(
    ("name", "problem"),
    [("plаnner", "mixes the letters of Cyrillic and Latin"), ("plan\u200bner", "is not printable")],
)
def test_a_look_alike_name_is_a_clear_error_before_the_body(name: str, problem: str) -> None:
    ran = []
    with pytest.raises(ValueError, match=problem), delegate(name):
        ran.append(name)
    assert ran == []
