"""The Planner / Budget example of ``seeds/recursive-delegation.md``, hop by hop, under both rules.

Hop  Call                        Chain on arrival             Default rule  Strict rule
1    user → Planner   plan       none                         allowed       allowed
2    Planner → Budget price      planner                      allowed       allowed
3    Budget → Planner itinerary  planner → budget             allowed       refused
4    Planner → Budget price      planner → budget → planner   refused       never sent
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import otel_guard
from otel_guard import DelegationRefused, agentic
from tests.hop_spans import chain_of


class TravelDesk:
    """Two agents that each do the reasonable thing, and together loop.

    Planner asks Budget to price its draft; Budget asks Planner for the itinerary; Planner asks Budget
    again. A refused call is answered with what the caller has. ``bounces`` bounds the script when
    nothing refuses (observe mode).
    """

    def __init__(self, bounces: int = 8) -> None:
        self.bounces = bounces
        self.refusals: list[DelegationRefused] = []

        @agentic(name="planner", skill="plan")
        def plan_trip(request: str) -> str:
            return f"plan for {request}, priced {self.ask(price_plan, 'draft')}"

        @agentic(name="budget", skill="price")
        def price_plan(draft: str) -> str:
            return f"EUR 1,380 for {self.ask(make_itinerary, draft)}"

        @agentic(name="planner", skill="itinerary")
        def make_itinerary(draft: str) -> str:
            return f"day-by-day of {draft} ({self.ask(price_plan, draft)})"

        self.plan_trip = plan_trip

    def ask(self, agent: Callable[[str], str], task: str) -> str:
        if self.bounces <= 1:
            return task
        self.bounces -= 1
        try:
            return agent(task)
        except DelegationRefused as refusal:
            self.refusals.append(refusal)
            return task


def hop_table(spans: Any) -> list[tuple[int, str, str, str, str]]:
    """(hop, call, skill, chain on arrival, result) for every hop span, in the order they started."""
    rows = []
    for span in sorted(spans.all(), key=lambda s: s.start_time):
        attributes = span.attributes
        agents, skills = chain_of(span, spans)  # a nested hop's from its parent hop's span
        caller = agents[-2] if len(agents) > 1 else "user"
        rows.append(
            (
                attributes["otel_guard.chain.depth"],
                f"{caller} → {agents[-1]}",
                skills[-1],
                " → ".join(agents[:-1]) or "none",
                attributes["otel_guard.decision"],
            )
        )
    return rows


def test_default_rule_same_agent_and_skill(spans: Any) -> None:
    desk = TravelDesk()
    answer = desk.plan_trip("a 3-day Lisbon trip under EUR 1,500")
    assert hop_table(spans) == [
        (1, "user → planner", "plan", "none", "allow"),
        (2, "planner → budget", "price", "planner", "allow"),
        (3, "budget → planner", "itinerary", "planner → budget", "allow"),
        (4, "planner → budget", "price", "planner → budget → planner", "refuse"),
    ]
    [refusal] = desk.refusals
    assert refusal.reason == "cycle"
    assert (refusal.status, refusal.code) == (409, "a2a_delegation_cycle")
    assert answer.startswith("plan for a 3-day Lisbon trip")  # the user gets an answer


def test_strict_rule_same_agent(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    desk = TravelDesk()
    desk.plan_trip("a 3-day Lisbon trip under EUR 1,500")
    assert hop_table(spans) == [
        (1, "user → planner", "plan", "none", "allow"),
        (2, "planner → budget", "price", "planner", "allow"),
        (3, "budget → planner", "itinerary", "planner → budget", "refuse"),
    ]  # hop 4 is never sent
    [refusal] = desk.refusals
    assert f"{refusal.status} {refusal.code}" == "409 a2a_delegation_cycle"
    assert str(refusal) == "Delegation cycle: agent planner is already in chain planner → budget"


@pytest.mark.parametrize("rule", ["agent_skill", "agent"])
def test_observe_mode_lets_the_loop_run_and_records_every_would_refuse(spans: Any, rule: str) -> None:
    otel_guard.configure(mode="observe", cycle_rule=rule)
    desk = TravelDesk(bounces=6)
    desk.plan_trip("a 3-day Lisbon trip under EUR 1,500")
    table = hop_table(spans)
    assert len(table) == 6  # nothing refused: the script's own bound stopped it
    assert desk.refusals == []
    first_flagged = 3 if rule == "agent" else 4
    assert [row[4] for row in table] == ["allow"] * (first_flagged - 1) + ["would_refuse"] * (
        7 - first_flagged
    )


def test_a_skill_renamed_on_every_pass_is_stopped_by_the_depth_limits(spans: Any) -> None:
    # The seed's stated limit of the default rule: a loop that changes shape is caught by depth.
    passes = 0

    def loop(n: int) -> None:
        nonlocal passes
        with otel_guard.delegate("planner", f"plan-v{n}"), otel_guard.delegate("budget", f"price-v{n}"):
            passes += 1
            loop(n + 1)

    with pytest.raises(DelegationRefused) as refused:
        loop(0)
    assert refused.value.reason == "depth"
    assert passes == 4  # 8 hops: planner, budget four times over; the ninth is refused
    assert [row[4] for row in hop_table(spans)] == ["allow"] * 8 + ["refuse"]
