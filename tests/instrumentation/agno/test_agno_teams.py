"""Agno teams under otel-guard: a leader's delegation to a member is a hop into the member, a transfer
when the team hands control over (route mode), and a refusal reaches the delegating model as text.

Team ``planner`` (its leader on a scripted model) delegates to member ``budget``, whose tool
``ask_planner`` runs the team again (``agno_loop.team_loop``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agno_loop import team_loop
from instrumentors import instrumentor_fixture

from otel_guard.instrumentation.agno import AgnoInstrumentor
from tests.hop_spans import decisions, guard_spans

instrumented = instrumentor_fixture(AgnoInstrumentor)

CYCLE = "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:"
CALLED = [
    ("invoke_agent planner", "allow", ("planner",)),
    ("invoke_agent budget", "allow", ("planner", "budget")),
    ("execute_tool ask_planner", "allow", ("planner", "budget", "ask_planner")),
    ("invoke_agent planner", "refuse", ("planner", "budget", "ask_planner", "planner")),
]


def kinds(spans: Any) -> list[str]:
    return [str(dict(s.attributes or {}).get("otel_guard.hop.kind")) for s in guard_spans(spans)]


@pytest.mark.parametrize("mode", ["coordinate", "broadcast"])
def test_a_member_the_leader_waits_for_is_called_and_the_loop_stops_at_the_first_bounce(
    instrumented: AgnoInstrumentor, spans: Any, mode: str
) -> None:
    loop = team_loop(mode)

    output = loop.team().run("Plan the offsite")

    assert (loop.calls.made, loop.teams) == (2, 2)
    (text,) = loop.budget_model.tool_results
    assert text.startswith(f"{CYCLE} agent planner is already in chain planner → budget → ask_planner.")
    (leader_read,) = loop.leader_model.tool_results
    assert f"budget answers after {CYCLE}" in leader_read
    assert str(output.content).startswith("planner answers after")
    assert decisions(spans) == CALLED
    assert kinds(spans) == ["call"] * 4


def test_a_route_team_transfers_to_its_member_and_a_return_to_a_waiting_member_is_refused(
    instrumented: AgnoInstrumentor, spans: Any
) -> None:
    loop = team_loop("route")

    output = loop.team().run("Plan the offsite")

    # planner ⇒ budget is a transfer: the leader waits for nothing, so planner again is no cycle;
    # budget, waiting on its tool call, is, when the second team routes to it.
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "budget", "ask_planner")),
        ("invoke_agent planner", "allow", ("planner", "budget", "ask_planner", "planner")),
        ("invoke_agent budget", "refuse", ("planner", "budget", "ask_planner", "planner", "budget")),
    ]
    assert kinds(spans) == ["call", "transfer", "call", "call", "transfer"]
    # The inner team answered with the refusal (a route team answers with its member's response),
    # and budget read it as its tool's result: no empty, success-shaped answer anywhere.
    (text,) = loop.budget_model.tool_results
    assert text.startswith(
        f"{CYCLE} agent budget is already in chain planner ⇒ budget → ask_planner → planner."
    )
    assert str(output.content).startswith(f"budget answers after {CYCLE}")


def test_an_async_team_stops_the_loop_the_same_way(instrumented: AgnoInstrumentor, spans: Any) -> None:
    loop = team_loop("coordinate")

    async def ask_planner(question: str) -> str:
        """Ask the planner team."""
        return str((await loop.team().arun(question)).content)

    loop.ask_planner = ask_planner  # type: ignore[method-assign]
    asyncio.run(loop.team().arun("Plan the offsite"))

    assert decisions(spans) == CALLED
