"""Strands Agents under otel-guard: runs and tool calls are hops, and a refusal reaches the model.

The agents are real Strands agents on scripted models (a subclass of ``strands.models.Model``, see
``strands_loop.py``); spans and metrics go to the session's in-memory SDK (tests/conftest.py), where
Strands' own spans land too.
"""

from __future__ import annotations

import asyncio
import gc
import re
from typing import Any

import pytest
import wrapt
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode
from pydantic import BaseModel
from strands import Agent, tool
from strands_loop import CallBudget, ScriptedModel, build_loop
from strands_support import decisions, guard_spans, instrumented_fixture, parent_of, strands_spans

import otel_guard
from otel_guard.instrumentation.strands import StrandsInstrumentor
from tests.conventions import assert_follows
from tests.hop_spans import assert_observe_mode_recorded_the_loop, chain_of, refused

instrumented = instrumented_fixture()

PLANNER_PATH = "planner → ask_budget → budget → ask_planner"


# -- the loop -----------------------------------------------------------------------------------


async def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    result = await loop.planner().invoke_async("Plan the team offsite")

    # Budget's call back into planner ran its tool, whose planner run was refused: planner ran
    # once, budget once, two tool calls in all, and both answered.
    assert (loop.planner_model.runs, loop.budget_model.runs, loop.calls.made) == (1, 1, 2)
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert result.stop_reason == "end_turn"
    assert str(result).startswith("planner answers after success: budget answers after error: Refused by")

    # The budget model got the refusal as Strands' failed tool result: reason, path, do not retry.
    (refusal,) = loop.budget_model.tool_results
    assert refusal["status"] == "error"
    (text,) = [block["text"] for block in refusal["content"]]
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert f"agent planner is already in chain {PLANNER_PATH}" in text
    assert "do not call it again" in text

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]
    (refusal,) = refused(spans)
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]


async def test_the_default_rule_and_the_agent_rule_stop_the_loop_at_the_same_bounce(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    await loop.planner().invoke_async("Plan the team offsite")

    assert loop.calls.made == 2
    assert decisions(spans)[-1][:2] == ("invoke_agent planner", "refuse")


async def test_a_tool_named_like_its_agent_is_one_hop_and_is_refused_before_its_body(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    # Tools named after the agent they run: calling tool `budget` is the delegation to agent budget.
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    result = await loop.planner().invoke_async("Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    # The refused tool's body never ran; the model got the refusal and both runs answered.
    assert loop.tool_bodies == {"budget": 1}
    (refusal,) = loop.budget_model.tool_results
    assert refusal["status"] == "error"
    assert "agent planner is already in chain planner → budget." in refusal["content"][0]["text"]
    assert result.stop_reason == "end_turn"


async def test_an_agent_offered_as_a_tool_is_one_hop_into_that_agent(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    # Strands' own agents-as-tools: each agent is the other's tool (`agent.as_tool()`), under a
    # tool name of its own. A call is one hop into the agent, and its run joins it.
    otel_guard.configure(cycle_rule="agent")
    calls = CallBudget(6)
    planner_model = ScriptedModel("planner", "ask_budget", calls, tool_input={"input": "price it"})
    budget_model = ScriptedModel("budget", "ask_planner", calls, tool_input={"input": "plan it"})
    planner = Agent(name="planner", model=planner_model, callback_handler=None)
    budget = Agent(
        name="budget", model=budget_model, tools=[planner.as_tool(name="ask_planner")], callback_handler=None
    )
    planner.tool_registry.register_tool(budget.as_tool(name="ask_budget"))

    result = await planner.invoke_async("Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert calls.made == 2
    (refusal,) = budget_model.tool_results
    assert refusal["status"] == "error"
    assert "agent planner is already in chain planner → budget." in refusal["content"][0]["text"]
    assert result.stop_reason == "end_turn"
    # The call's hop span sits under Strands' span of the tool call, and Strands' span of the
    # agent's run inside it under the hop's.
    hop = next(s for s in guard_spans(spans) if s.name == "invoke_agent budget")
    assert parent_of(hop, spans).name == "execute_tool ask_budget"  # type: ignore[union-attr]
    (budget_run,) = [s for s in strands_spans(spans) if s.name == "invoke_agent budget"]
    assert parent_of(budget_run, spans) is hop


async def test_a_delegation_to_an_agent_tool_is_one_hop_and_keeps_strands_delegation(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    # as_tool(delegate=True): Strands' AgentDelegation makes the agent's answer the final one.
    calls = CallBudget(1)
    budget = Agent(name="budget", model=ScriptedModel("budget", None, calls), callback_handler=None)
    planner_model = ScriptedModel("planner", "budget", calls, tool_input={"input": "price it"})
    planner = Agent(
        name="planner", model=planner_model, tools=[budget.as_tool(delegate=True)], callback_handler=None
    )

    result = await planner.invoke_async("Plan the team offsite")

    assert str(result).strip() == "budget answers without tools"
    assert len(planner_model.requests) == 1  # no model call after the delegation
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
    ]


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: StrandsInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe", max_depth=32, max_name_depth=32)
    loop = build_loop()

    result = await loop.planner().invoke_async("Plan the team offsite")

    # Nothing refused: the scripted models bounded the bouncing (six tool calls in all).
    assert loop.calls.made == 6
    assert (loop.planner_model.runs, loop.budget_model.runs) == (4, 3)
    assert all(r["status"] == "success" for r in loop.budget_model.tool_results)
    assert result.stop_reason == "end_turn"

    assert_observe_mode_recorded_the_loop(spans, metric_reader)


# -- spans --------------------------------------------------------------------------------------


async def test_spans_carry_the_contract_attributes_and_sit_under_strands_own(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=1)

    await loop.planner().invoke_async("Plan the team offsite")

    by_name = {s.name: s for s in guard_spans(spans)}
    assert list(by_name) == ["invoke_agent planner", "execute_tool ask_budget", "invoke_agent budget"]
    tool_hop = by_name["execute_tool ask_budget"]
    assert dict(tool_hop.attributes or {}) | {"otel_guard.chain.root": "<root>"} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "ask_budget",
        "otel_guard.chain.agents": ("planner", "ask_budget"),
        "otel_guard.chain.skills": ("", ""),
        "otel_guard.chain.root": "<root>",
        "otel_guard.chain.depth": 2,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 2,
    }
    agent_hop = by_name["invoke_agent budget"]
    assert agent_hop.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent_hop.attributes["gen_ai.agent.name"] == "budget"
    assert agent_hop.attributes["otel_guard.chain.depth"] == 3
    roots = {s.attributes["otel_guard.chain.root"] for s in by_name.values()}
    assert len(roots) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", str(roots.pop()))

    # Each hop span is a child of Strands' own span of the same call, with no guard attributes on
    # Strands' span; all in one trace.
    for hop in by_name.values():
        theirs = parent_of(hop, spans)
        assert theirs is not None, hop.name
        assert theirs.name == hop.name
        assert not any(key.startswith("otel_guard.") for key in theirs.attributes or {})
    # What the tool runs (budget's run) is inside the tool's hop.
    (budget_run,) = [s for s in strands_spans(spans) if s.name == "invoke_agent budget"]
    assert parent_of(budget_run, spans) is tool_hop
    assert len({s.context.trace_id for s in spans.all()}) == 1


async def test_a_refused_tool_call_stands_under_strands_span_of_the_call_it_failed(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    await loop.planner().invoke_async("Plan the team offsite")

    # The hop is decided inside Strands' span of the call: Strands records the call, failed.
    (refusal,) = refused(spans)
    assert refusal.name == "execute_tool planner"
    theirs = parent_of(refusal, spans)
    assert theirs is not None
    assert theirs.name == "execute_tool planner"
    assert theirs.status.status_code == StatusCode.ERROR
    assert "otel_guard.decision" not in (theirs.attributes or {})


# -- entry points and tools ---------------------------------------------------------------------


def answering_agent(name: str) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(name, None, CallBudget(0))
    return Agent(name=name, model=model, callback_handler=None), model


async def test_every_entry_point_makes_one_hop_per_run(instrumented: StrandsInstrumentor, spans: Any) -> None:
    solo, model = answering_agent("solo")

    await solo.invoke_async("a")
    async for _event in solo.stream_async("b"):
        pass

    assert model.runs == 2
    assert [chain_of(s, spans)[0] for s in guard_spans(spans)] == [("solo",)] * 2


async def test_a_run_in_a_session_carries_its_id_and_follows_the_conventions(
    instrumented: StrandsInstrumentor, spans: Any, tmp_path: Any
) -> None:
    from strands.session.file_session_manager import FileSessionManager

    model = ScriptedModel("solo", None, CallBudget(0))
    sessions = FileSessionManager(session_id="trip-42", storage_dir=str(tmp_path))
    solo = Agent(name="solo", model=model, callback_handler=None, session_manager=sessions)

    await solo.invoke_async("a")

    (hop,) = guard_spans(spans)
    assert hop.attributes is not None
    assert hop.attributes["gen_ai.conversation.id"] == "trip-42"
    assert_follows(hop, available={"gen_ai.agent.name", "gen_ai.conversation.id"})


def test_the_sync_entry_point_makes_one_hop(instrumented: StrandsInstrumentor, spans: Any) -> None:
    # agent(...) runs the invocation in a thread of its own, with the caller's context copied.
    solo, _model = answering_agent("solo")

    with otel_guard.delegate("caller"):
        assert str(solo("a")).strip() == "solo answers without tools"

    assert decisions(spans) == [
        ("invoke_agent caller", "allow", ("caller",)),
        ("invoke_agent solo", "allow", ("caller", "solo")),
    ]


async def test_a_run_whose_stream_is_abandoned_still_ends_its_hop(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    solo, _model = answering_agent("solo")
    abandoned: list[Any] = []

    async def first_event() -> None:
        # A caller that stops reading after one event and never closes the stream.
        stream = solo.stream_async("a")
        abandoned.append(stream)
        async for _event in stream:
            break

    await asyncio.create_task(first_event())
    # Dropped here, the stream is closed by the event loop's finalizer, from a context that is not
    # the run's.
    abandoned.clear()
    gc.collect()
    for _ in range(20):
        if guard_spans(spans):
            break
        await asyncio.sleep(0.01)

    assert [s.name for s in guard_spans(spans)] == ["invoke_agent solo"]


def lookup_agent(seen: list[tuple[str, ...]], parallel: int = 1) -> Agent:
    @tool
    def lookup(question: str) -> str:
        """Look something up."""
        chain = otel_guard.current_chain()
        seen.append(tuple(hop.agent for hop in chain.hops) if chain is not None else ())
        return question.upper()

    model = ScriptedModel("searcher", "lookup", CallBudget(parallel), parallel=parallel)
    return Agent(name="searcher", model=model, tools=[lookup], callback_handler=None)


async def test_a_sync_tool_runs_inside_its_hop(instrumented: StrandsInstrumentor) -> None:
    # Strands runs a sync tool in a worker thread: the chain follows the call there.
    seen: list[tuple[str, ...]] = []

    await lookup_agent(seen).invoke_async("find")

    assert seen == [("searcher", "lookup")]


def test_a_direct_tool_call_is_a_hop(instrumented: StrandsInstrumentor, spans: Any) -> None:
    seen: list[tuple[str, ...]] = []
    agent = lookup_agent(seen)

    with otel_guard.delegate("caller"):
        result = agent.tool.lookup(question="venues")

    assert result["status"] == "success"

    assert seen == [("caller", "lookup")]
    assert decisions(spans)[-1] == ("execute_tool lookup", "allow", ("caller", "lookup"))


async def test_structured_output_is_an_answer_not_a_hop(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    class Price(BaseModel):
        amount: int

    model = ScriptedModel("budget", "Price", CallBudget(1), tool_input={"amount": 1200})
    agent = Agent(name="budget", model=model, callback_handler=None)

    result = await agent.invoke_async("Price the offsite", structured_output_model=Price)

    assert result.structured_output == Price(amount=1200)
    assert decisions(spans) == [("invoke_agent budget", "allow", ("budget",))]


async def test_parallel_tool_calls_are_siblings_not_a_cycle(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[tuple[str, ...]] = []

    result = await lookup_agent(seen, parallel=2).invoke_async("find")

    assert seen == [("searcher", "lookup")] * 2
    lookups = [s for s in guard_spans(spans) if s.name == "execute_tool lookup"]
    assert [s.attributes["otel_guard.decision"] for s in lookups] == ["allow", "allow"]
    assert str(result).count("success") == 2


async def test_a_refused_run_outside_any_tool_raises_before_the_model_is_called(
    instrumented: StrandsInstrumentor,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner, model = answering_agent("planner")

    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused) as raised:
        await planner.invoke_async("again")

    assert raised.value.reason == "cycle"
    assert model.requests == []
    assert planner.messages == []  # the refused prompt never entered the history


# -- suppression and uninstrument ---------------------------------------------------------------


async def test_suppressed_instrumentation_makes_no_hop(instrumented: StrandsInstrumentor, spans: Any) -> None:
    loop = build_loop()

    with suppress_instrumentation():
        result = await loop.planner().invoke_async("Plan the team offsite")

    # Unguarded: the loop bounced until the scripted models stopped it.
    assert loop.calls.made == 6
    assert result.stop_reason == "end_turn"
    assert guard_spans(spans) == []


async def test_uninstrument_restores_strands(spans: Any) -> None:
    from strands.agent.agent import Agent as AgentClass
    from strands.multiagent.swarm import Swarm

    instrumentor = StrandsInstrumentor()
    instrumentor.instrument()
    assert isinstance(AgentClass.__dict__["__init__"], wrapt.FunctionWrapper)
    seen: list[tuple[str, ...]] = []
    built_while_instrumented = lookup_agent(seen)
    instrumentor.uninstrument()

    assert not isinstance(AgentClass.__dict__["__init__"], wrapt.ObjectProxy)
    assert not isinstance(Swarm.__dict__["__init__"], wrapt.ObjectProxy)
    # An agent built while instrumented keeps the hooks Strands gave it, and they do nothing now.
    await built_while_instrumented.invoke_async("find")
    assert seen == [()]  # no chain in force: the tool ran outside any hop
    # The loop, built now, runs unguarded, bounded only by the scripted models.
    loop = build_loop()
    result = await loop.planner().invoke_async("Plan the team offsite")
    assert loop.calls.made == 6
    assert result.stop_reason == "end_turn"
    assert guard_spans(spans) == []
