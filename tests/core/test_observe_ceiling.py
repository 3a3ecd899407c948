"""Observe mode's hard stop: a loop that observe mode lets through ends at ``observe_max_depth``."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import baggage

import otel_guard
from otel_guard import DelegationRefused, agentic, delegate
from otel_guard.settings import DEFAULT_OBSERVE_MAX_DEPTH, settings_from_env

CHAIN_KEY = "otel_guard.chain"


def attr(span: Any, name: str) -> Any:
    return (span.attributes or {}).get(name)


def test_a_runaway_loop_in_observe_mode_stops_at_the_ceiling(spans: Any, key: Any) -> None:
    # Planner and budget call each other with no stop of their own: observe mode lets the cycle and
    # the depth through as would-refuse, until the chain would grow past observe_max_depth.
    otel_guard.configure(mode="observe", max_hops=0)
    runs: list[int] = []

    @agentic(name="planner")
    def planner() -> None:
        runs.append(1)
        budget()

    @agentic(name="budget")
    def budget() -> None:
        planner()

    with pytest.raises(DelegationRefused) as refused:
        planner()
    err = refused.value
    assert err.reason == "observe_ceiling"
    assert err.code == "a2a_delegation_depth"
    assert err.chain is not None
    assert err.chain.depth == DEFAULT_OBSERVE_MAX_DEPTH
    assert "observe_max_depth 32" in str(err)
    assert len(runs) == DEFAULT_OBSERVE_MAX_DEPTH // 2  # 16 planner runs, 16 budget runs
    refusals = [s for s in spans.all() if attr(s, "otel_guard.decision") == "refuse"]
    assert [attr(s, "otel_guard.reason") for s in refusals] == ["observe_ceiling"]
    assert [e.name for e in refusals[0].events] == ["otel_guard.refused"]
    assert attr(refusals[0], "otel_guard.mode") == "observe"


def test_the_ceiling_is_a_setting(spans: Any) -> None:
    otel_guard.configure(mode="observe", max_depth=3, observe_max_depth=4, max_hops=0)
    with delegate("a"), delegate("a"), delegate("a"), delegate("a") as fourth:
        assert fourth.decision == "would_refuse"  # depth and name depth let through
        with pytest.raises(DelegationRefused, match="observe_max_depth 4") as refused, delegate("a"):
            pass
    assert refused.value.reason == "observe_ceiling"


def test_enforce_mode_never_meets_the_ceiling() -> None:
    otel_guard.configure(mode="enforce", max_depth=2, observe_max_depth=2)
    with delegate("a"), delegate("b"), pytest.raises(DelegationRefused) as refused, delegate("c"):
        pass
    assert refused.value.reason == "depth"


def test_a_chain_at_the_default_ceiling_fits_in_baggage(key: Any) -> None:
    # The default stands well under W3C baggage's 4 KB a member, so the ceiling, not chain_size,
    # is what stops an observe-mode loop of agents with ordinary names and skills.
    otel_guard.configure(mode="observe", max_hops=0)
    names = ["trip_planner_agent", "budget_estimator_agent"]
    contexts = [delegate(names[i % 2], "price_the_itinerary") for i in range(DEFAULT_OBSERVE_MAX_DEPTH)]
    for hop in contexts:
        hop.__enter__()
    try:
        token = str(baggage.get_baggage(CHAIN_KEY))
        assert otel_guard.current_chain() is not None
        assert len(token) < 3072, len(token)  # 2,266 characters
    finally:
        for hop in reversed(contexts):
            hop.__exit__(None, None, None)


def test_the_ceiling_must_stand_at_or_above_every_max_depth() -> None:
    with pytest.raises(ValueError, match="observe_max_depth: 8 is less than max_depth 9"):
        otel_guard.configure(observe_max_depth=8, max_depth=9)
    with pytest.raises(ValueError, match="less than max_depth 40"):
        otel_guard.configure(overrides={"deep": {"max_depth": 40}})
    settings = otel_guard.configure(max_depth=40, observe_max_depth=40)
    assert settings.observe_max_depth == 40
    with pytest.raises(ValueError, match="OTEL_GUARD_OBSERVE_MAX_DEPTH: observe_max_depth: 32"):
        settings_from_env({"OTEL_GUARD_MAX_DEPTH": "33"})
    with pytest.raises(ValueError, match=r"OTEL_GUARD_OBSERVE_MAX_DEPTH: .* is less than 1"):
        settings_from_env({"OTEL_GUARD_OBSERVE_MAX_DEPTH": "0"})
    assert settings_from_env({"OTEL_GUARD_OBSERVE_MAX_DEPTH": "64"}).observe_max_depth == 64
