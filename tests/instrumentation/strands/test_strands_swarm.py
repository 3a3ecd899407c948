"""Strands swarm handoffs under otel-guard: a handoff is a hop into the node it hands off to.

Planner and budget form a ``Swarm`` whose scripted models hand off to each other on every fresh turn
(``handoff_to_agent``), the ping-pong Strands bounds only by ``max_handoffs`` (its repetitive
handoff detection is off by default). The scripts give up after six handoffs in all.
"""

from __future__ import annotations

from typing import Any

from strands import Agent
from strands.multiagent import Status, Swarm
from strands_loop import CallBudget, ScriptedModel
from strands_support import decisions, guard_spans, instrumented_fixture, parent_of

import otel_guard
from otel_guard.instrumentation.strands import StrandsInstrumentor

instrumented = instrumented_fixture()


def ping_pong(handoffs: int = 6) -> tuple[Swarm, ScriptedModel, ScriptedModel, CallBudget]:
    calls = CallBudget(handoffs)

    def node(me: str, other: str) -> tuple[Agent, ScriptedModel]:
        handoff = {"agent_name": other, "message": f"{me} needs {other}"}
        model = ScriptedModel(me, "handoff_to_agent", calls, tool_input=handoff)
        return Agent(name=me, model=model, callback_handler=None), model

    planner, planner_model = node("planner", "budget")
    budget, budget_model = node("budget", "planner")
    return Swarm([planner, budget], max_handoffs=20, max_iterations=20), planner_model, budget_model, calls


async def test_a_handoff_back_to_a_node_on_the_path_is_refused_and_the_swarm_ends(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    swarm, planner_model, budget_model, calls = ping_pong()

    result = await swarm.invoke_async("Plan the team offsite")

    # Planner handed off to budget; budget's handoff back was refused, budget's model read the
    # refusal as its tool's error and answered, and the swarm completed with budget.
    assert result.status == Status.COMPLETED
    assert [node.node_id for node in result.node_history] == ["planner", "budget"]
    assert calls.made == 2
    (refusal,) = budget_model.tool_results
    assert refusal["status"] == "error"
    text = refusal["content"][0]["text"]
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle)")
    assert "agent planner is already in chain planner → budget" in text
    assert planner_model.tool_results[0]["status"] == "success"

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    # The handoff's hop is a child of Strands' span of the handoff call, and lasts until the
    # node it handed off to has run.
    handoff = guard_spans(spans)[1]
    assert parent_of(handoff, spans).name == "execute_tool handoff_to_agent"  # type: ignore[union-attr]
    refused = guard_spans(spans)[2]
    assert handoff.start_time < refused.start_time < refused.end_time < handoff.end_time  # type: ignore[operator]


async def test_unguarded_the_swarm_ping_pongs_until_the_scripts_give_up(spans: Any) -> None:
    swarm, _planner_model, _budget_model, calls = ping_pong()

    result = await swarm.invoke_async("Plan the team offsite")

    assert result.status == Status.COMPLETED
    assert calls.made == 6
    assert len(result.node_history) == 7
    assert guard_spans(spans) == []


async def test_observe_mode_lets_the_handoffs_through_and_records_would_refuse(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_depth=32, max_name_depth=32)
    swarm, _planner_model, _budget_model, calls = ping_pong()

    result = await swarm.invoke_async("Plan the team offsite")

    assert result.status == Status.COMPLETED
    assert calls.made == 6
    would = [s for s in guard_spans(spans) if s.attributes["otel_guard.decision"] == "would_refuse"]
    assert would
    assert would[0].name == "invoke_agent planner"
    assert would[0].attributes["otel_guard.chain.agents"] == ("planner", "budget", "planner")
    # Each handoff hop is the target's run: no node's run adds a hop of its own after a handoff.
    assert len(guard_spans(spans)) == 7  # the entry node's run and six handoffs
