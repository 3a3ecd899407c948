"""LlamaIndex under otel-guard: runs and tool calls are hops, and a refusal reaches the model (handoffs:
test_llama_index_handoffs.py).

The agents are real LlamaIndex ``FunctionAgent`` s and ``AgentWorkflow`` s on LlamaIndex's own offline
``MockFunctionCallingLLM`` (scripted in ``llama_index_loop.py``); spans and metrics go to the
session's in-memory SDK (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.agent.workflow.base_agent import BaseWorkflowAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow import Context
from llama_index_loop import CallBudget, ScriptedModel, agent, build_loop
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor
from otel_guard.instrumentation.llama_index._runs import run_dispatcher, run_ends
from tests.conventions import assert_follows
from tests.hop_spans import assert_observe_mode_recorded_the_loop, chain_of, decisions, guard_spans, refused

instrumented = instrumentor_fixture(LlamaIndexInstrumentor)

PLANNER_PATH = "planner → budget"  # an agent a tool runs takes the tool's place in the chain
TEAM_OF_THREE = (("planner", "ask_budget"), ("budget", "ask_auditor"), ("auditor", None))


# -- the loop through agents run by tools -------------------------------------------------------


async def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    output = await loop.planner().run(user_msg="Plan the team offsite")

    # Budget's call back into planner ran its tool, whose planner run was refused: planner ran
    # once, budget once, two tool calls in all, and both answered.
    assert (loop.planner_model.runs, loop.budget_model.runs, loop.calls.made) == (1, 1, 2)
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert str(output).startswith("planner answers after: budget answers after: Refused by otel-guard")

    # The budget model read the refusal as the tool's result: reason, path, do not retry.
    (text,) = loop.budget_model.tool_results
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert f"agent planner is already in chain {PLANNER_PATH}." in text
    assert "do not call it again" in text

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]
    assert run_ends.open_runs == 0


async def test_the_default_rule_and_the_agent_rule_stop_the_loop_at_the_same_bounce(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    await loop.planner().run(user_msg="Plan the team offsite")

    assert loop.calls.made == 2
    assert decisions(spans)[-1][:2] == ("invoke_agent planner", "refuse")


async def test_an_agent_run_directly_by_a_tool_is_one_place_of_the_chain_under_the_tools_span(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # Planner's ask_budget runs budget: the call is one hop in the chain, in the agent's name, as
    # the processor reads a tool call with an agent run below it; the agent's hop nests in the call's.
    loop = build_loop(max_tool_calls=1)

    await loop.planner().run(user_msg="Plan the team offsite")

    by_name = {s.name: s for s in guard_spans(spans)}
    tool_hop, agent_hop = by_name["execute_tool ask_budget"], by_name["invoke_agent budget"]
    assert agent_hop.parent is not None
    assert agent_hop.parent.span_id == tool_hop.context.span_id
    assert agent_hop.attributes is not None
    assert chain_of(agent_hop, spans)[0] == ("planner", "budget")
    assert agent_hop.attributes["otel_guard.chain.depth"] == 2
    assert (
        agent_hop.attributes["otel_guard.chain.root"]
        == by_name["invoke_agent planner"].attributes[  # type: ignore[index]
            "otel_guard.chain.root"
        ]
    )


async def test_the_depth_of_agents_called_as_tools_counts_agents(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # Planner asks budget, budget asks auditor, each through a tool of another name: three agents,
    # within max_depth 3 (counting the tools, the auditor's run would stand fifth).
    otel_guard.configure(max_depth=3)
    calls, bodies = CallBudget(2), Counter[str]()
    models = {name: ScriptedModel(name, tool, calls) for name, tool in TEAM_OF_THREE}

    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        bodies["ask_budget"] += 1
        return str(await agent("budget", models["budget"], [auditor_tool]).run(user_msg=question))

    async def ask_auditor(question: str) -> str:
        """Ask the auditor whether the budget holds."""
        bodies["ask_auditor"] += 1
        return str(await agent("auditor", models["auditor"], []).run(user_msg=question))

    auditor_tool = FunctionTool.from_defaults(async_fn=ask_auditor)
    planner = agent("planner", models["planner"], [FunctionTool.from_defaults(async_fn=ask_budget)])

    output = await planner.run(user_msg="Plan the team offsite")

    assert refused(spans) == []
    assert bodies == {"ask_budget": 1, "ask_auditor": 1}
    assert ("invoke_agent auditor", "allow", ("planner", "budget", "auditor")) in decisions(spans)
    assert str(output).startswith("planner answers after: budget answers after: auditor answers")


async def test_an_agent_run_after_another_hop_in_the_tools_body_keeps_the_tool_in_the_chain(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # Not directly in the tool's body (the body entered a hop of its own first): nothing is left out.
    calls = CallBudget(1)

    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        async with otel_guard.delegate("lookup"):
            budget = agent("budget", ScriptedModel("budget", None, calls), [])
            return str(await budget.run(user_msg=question))

    tool = FunctionTool.from_defaults(async_fn=ask_budget)
    await agent("planner", ScriptedModel("planner", "ask_budget", calls), [tool]).run(user_msg="Plan")

    assert ("invoke_agent budget", "allow", ("planner", "ask_budget", "lookup", "budget")) in decisions(spans)


async def test_a_tool_named_like_its_agent_is_one_hop_and_is_refused_before_its_body(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # Tools named after the agent they run: calling tool `budget` is the delegation to agent budget,
    # and the agent's run inside it joins the call's hop.
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    output = await loop.planner().run(user_msg="Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    # The refused tool's body never ran; the model read the refusal and both runs answered.
    assert loop.tool_bodies == {"budget": 1}
    (text,) = loop.budget_model.tool_results
    assert "agent planner is already in chain planner → budget." in text
    assert str(output).startswith("planner answers after: budget answers after: Refused by otel-guard")


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: LlamaIndexInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe", max_depth=32, max_name_depth=32)
    loop = build_loop()

    output = await loop.planner().run(user_msg="Plan the team offsite")

    # Nothing refused: the scripted models bounded the bouncing (six tool calls in all).
    assert loop.calls.made == 6
    assert (loop.planner_model.runs, loop.budget_model.runs) == (4, 3)
    assert not any("Refused" in text for text in loop.budget_model.tool_results)
    assert str(output).startswith("planner answers after:")

    assert_observe_mode_recorded_the_loop(spans, metric_reader)


# -- spans --------------------------------------------------------------------------------------


async def test_a_run_with_a_memory_carries_its_session_and_follows_the_conventions(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    from llama_index.core.memory import Memory

    solo = agent("solo", ScriptedModel("solo", None, CallBudget(0)), [])
    memory = Memory.from_defaults(session_id="trip-42")

    try:
        await solo.run(user_msg="a", memory=memory)
    finally:
        # The memory's SQLite store runs on aiosqlite's worker thread; left open, that thread
        # outlives this test's event loop and dies in a later test ("Event loop is closed").
        engine = memory.sql_store._async_engine  # type: ignore[attr-defined]
        if engine is not None:
            await engine.dispose()

    (hop,) = guard_spans(spans)
    assert hop.attributes is not None
    assert hop.attributes["gen_ai.conversation.id"] == "trip-42"
    assert_follows(hop, available={"gen_ai.agent.name", "gen_ai.conversation.id"})


async def test_spans_carry_the_contract_attributes_and_nest_in_one_trace(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=1)

    await loop.planner().run(user_msg="Plan the team offsite")

    by_name = {s.name: s for s in guard_spans(spans)}
    assert list(by_name) == ["invoke_agent planner", "execute_tool ask_budget", "invoke_agent budget"]
    tool_hop = by_name["execute_tool ask_budget"]
    assert dict(tool_hop.attributes or {}) | {"otel_guard.chain.root": "<root>"} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "ask_budget",
        "otel_guard.chain.root": "<root>",
        "otel_guard.chain.depth": 2,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 2,
    }
    # Directly under the planner's hop span: lean, its chain its parent hop's and its own.
    assert chain_of(tool_hop, spans) == (("planner", "ask_budget"), ("", ""))
    agent_hop = by_name["invoke_agent budget"]
    assert agent_hop.attributes is not None
    assert agent_hop.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent_hop.attributes["gen_ai.agent.name"] == "budget"
    roots = {s.attributes["otel_guard.chain.root"] for s in by_name.values()}  # type: ignore[index]
    assert len(roots) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", str(roots.pop()))
    # Each hop is the child of the hop it was made in, all in one trace; the run's hop ends last.
    run_hop = by_name["invoke_agent planner"]
    assert run_hop.parent is None
    assert tool_hop.parent is not None
    assert tool_hop.parent.span_id == run_hop.context.span_id
    assert agent_hop.parent is not None
    assert agent_hop.parent.span_id == tool_hop.context.span_id
    assert len({s.context.trace_id for s in by_name.values()}) == 1
    assert max(s.end_time or 0 for s in by_name.values()) == run_hop.end_time


async def test_a_run_that_fails_ends_its_hop_with_the_error(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    def broken(messages: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the model is down")

    solo = FunctionAgent(
        name="solo", description="Fails.", llm=ScriptedModel("solo", None, CallBudget(0)).llm()
    )
    solo.llm._response_generator = broken  # type: ignore[attr-defined]

    with pytest.raises(ConnectionError):
        await solo.run(user_msg="a")

    (hop,) = guard_spans(spans)
    assert hop.name == "invoke_agent solo"
    assert hop.status.status_code == StatusCode.ERROR
    assert hop.attributes is not None
    assert hop.attributes["error.type"] == "ConnectionError"
    assert run_ends.open_runs == 0


async def test_a_cancelled_run_ends_its_hop(instrumented: LlamaIndexInstrumentor, spans: Any) -> None:
    started = asyncio.Event()

    async def wait_forever(question: str) -> str:
        """Wait."""
        started.set()
        await asyncio.Event().wait()
        return question

    model = ScriptedModel("waiter", "wait_forever", CallBudget(1))
    waiter = agent("waiter", model, [FunctionTool.from_defaults(async_fn=wait_forever)])

    handler = waiter.run(user_msg="a")
    await started.wait()
    await handler.cancel_run()

    assert [s.name for s in guard_spans(spans)] == ["invoke_agent waiter", "execute_tool wait_forever"]
    assert all(s.end_time is not None for s in guard_spans(spans))
    assert run_ends.open_runs == 0


# -- runs and tools -----------------------------------------------------------------------------


async def test_a_refused_run_outside_any_tool_raises_from_run_before_the_model_is_called(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    model = ScriptedModel("planner", None, CallBudget(0))
    planner = agent("planner", model, [])

    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused) as raised:
        planner.run(user_msg="again")

    assert raised.value.reason == "cycle"
    assert model.requests == []


# LlamaIndex warns that a context's memory is not serialized when a run continues it: "expected".
@pytest.mark.filterwarnings("ignore::workflows.context.state_store.UnserializableKeyWarning")
async def test_a_streamed_run_and_a_run_continuing_a_context_are_one_hop_each(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    model = ScriptedModel("solo", None, CallBudget(0))
    solo = agent("solo", model, [])

    handler = solo.run(user_msg="a")
    events = [type(event).__name__ async for event in handler.stream_events()]
    await handler
    ctx = Context(solo)
    await solo.run(user_msg="b", ctx=ctx)
    await solo.run(user_msg="c", ctx=ctx)  # the same conversation, a run of its own

    assert "AgentOutput" in events
    assert model.runs == 3
    assert [chain_of(s, spans)[0] for s in guard_spans(spans)] == [("solo",)] * 3  # type: ignore[index]


async def test_a_react_agent_reads_a_refusal_as_its_observation(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    # ReActAgent calls tools in text (Thought / Action / Action Input), through the same tool step.
    observations: list[str] = []

    def respond(messages: Any, **kwargs: Any) -> ChatMessage:
        last = messages[-1].content or ""
        if last.startswith("Observation:"):
            observations.append(last)
            return ChatMessage(
                role=MessageRole.ASSISTANT, content="Thought: I can answer.\nAnswer: priced it"
            )
        action = 'Thought: I ask the planner.\nAction: planner\nAction Input: {"question": "the plan?"}'
        return ChatMessage(role=MessageRole.ASSISTANT, content=action)

    def planner(question: str) -> str:
        """Ask the planner."""
        raise AssertionError("a refused call never runs")

    budget = ReActAgent(
        name="budget",
        description="Prices a plan.",
        llm=MockFunctionCallingLLM(response_generator=respond),
        tools=[FunctionTool.from_defaults(fn=planner)],
    )

    with otel_guard.delegate("planner"):
        output = await budget.run(user_msg="Price the offsite")

    assert str(output) == "priced it"
    (observation,) = observations
    assert observation.startswith("Observation: Refused by otel-guard (a2a_delegation_cycle, reason: cycle)")
    assert decisions(spans)[-1] == ("execute_tool planner", "refuse", ("planner", "budget", "planner"))


def lookup_agent(seen: list[tuple[str, ...]], *, parallel: int = 1, sync: bool = True) -> FunctionAgent:
    def lookup(question: str) -> str:
        """Look something up."""
        chain = otel_guard.current_chain()
        seen.append(tuple(hop.agent for hop in chain.hops) if chain is not None else ())
        return question.upper()

    async def alookup(question: str) -> str:
        """Look something up."""
        return lookup(question)

    tool = (
        FunctionTool.from_defaults(fn=lookup) if sync else FunctionTool.from_defaults(alookup, name="lookup")
    )
    return agent(
        "searcher", ScriptedModel("searcher", "lookup", CallBudget(parallel), parallel=parallel), [tool]
    )


async def test_a_sync_tool_runs_inside_its_hop_in_its_thread(instrumented: LlamaIndexInstrumentor) -> None:
    # LlamaIndex runs a sync tool in the executor, with the step's context copied: the chain follows.
    seen: list[tuple[str, ...]] = []

    await lookup_agent(seen).run(user_msg="find")

    assert seen == [("searcher", "lookup")]


async def test_parallel_tool_calls_are_siblings_not_a_cycle(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[tuple[str, ...]] = []

    output = await lookup_agent(seen, parallel=2, sync=False).run(user_msg="find")

    assert seen == [("searcher", "lookup")] * 2
    lookups = [s for s in guard_spans(spans) if s.name == "execute_tool lookup"]
    assert [s.attributes["otel_guard.decision"] for s in lookups] == ["allow", "allow"]  # type: ignore[index]
    assert str(output) == "searcher answers after: FROM SEARCHER"


async def test_a_tool_that_fails_ends_its_hop_with_the_error_the_model_reads(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    def lookup(question: str) -> str:
        """Look something up."""
        raise KeyError(question)

    model = ScriptedModel("searcher", "lookup", CallBudget(1))
    await agent("searcher", model, [FunctionTool.from_defaults(fn=lookup)]).run(user_msg="find")

    assert model.tool_results == ["'from searcher'"]  # LlamaIndex's own error text, unchanged
    (tool_hop,) = [s for s in guard_spans(spans) if s.name == "execute_tool lookup"]
    assert tool_hop.status.status_code == StatusCode.ERROR


# -- suppression and uninstrument ---------------------------------------------------------------


async def test_suppressed_instrumentation_makes_no_hop(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    with suppress_instrumentation():
        output = await loop.planner().run(user_msg="Plan the team offsite")

    # Unguarded: the loop bounced until the scripted models stopped it.
    assert loop.calls.made == 6
    assert str(output).startswith("planner answers after:")
    assert guard_spans(spans) == []


async def test_uninstrument_restores_llama_index(spans: Any) -> None:
    methods = [
        (owner, name) for owner in (BaseWorkflowAgent, AgentWorkflow) for name in ("run", "_call_tool")
    ]
    bare = {key: key[0].__dict__[key[1]] for key in methods}
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument()
    for owner, name in methods:
        assert owner.__dict__[name] is not bare[owner, name]
        assert owner.__dict__[name].__wrapped__ is bare[owner, name]
    assert any(handler is run_ends for handler in run_dispatcher().span_handlers)
    instrumentor.uninstrument()

    for owner, name in methods:
        assert owner.__dict__[name] is bare[owner, name], (owner, name)
    assert not any(handler is run_ends for handler in run_dispatcher().span_handlers)
    loop = build_loop()
    await loop.planner().run(user_msg="Plan the team offsite")
    assert loop.calls.made == 6
    assert guard_spans(spans) == []


def test_the_run_handler_listens_only_where_the_runs_spans_open(instrumented: LlamaIndexInstrumentor) -> None:
    # On the root dispatcher it would be called at every LlamaIndex span (15 a one-tool run); the
    # installed workflows package opens the runs' spans on a dispatcher of its own.
    assert run_dispatcher() is not get_dispatcher()
    assert any(handler is run_ends for handler in run_dispatcher().span_handlers)
    assert not any(handler is run_ends for handler in get_dispatcher().span_handlers)


async def test_uninstrument_during_a_run_still_ends_its_hop(spans: Any) -> None:
    instrumentor = LlamaIndexInstrumentor()
    instrumentor.instrument()
    release = asyncio.Event()

    async def wait(question: str) -> str:
        """Wait for the release."""
        await release.wait()
        return question

    waiter = agent(
        "waiter", ScriptedModel("waiter", "wait", CallBudget(1)), [FunctionTool.from_defaults(async_fn=wait)]
    )
    handler = waiter.run(user_msg="a")
    await asyncio.sleep(0.05)
    instrumentor.uninstrument()
    assert any(handler is run_ends for handler in run_dispatcher().span_handlers)  # the run is open
    release.set()
    await handler

    assert [s.name for s in guard_spans(spans)] == ["invoke_agent waiter", "execute_tool wait"]
    assert all(s.end_time is not None for s in guard_spans(spans))
    assert not any(h is run_ends for h in run_dispatcher().span_handlers)
