"""Google ADK under otel-guard: agent runs, agents as tools and function tools are hops, and a refusal
reaches the model as ADK's own tool error.

The agents are real ADK ``LlmAgent``\\ s run by ``InMemoryRunner``, driven by the offline
``ScriptedModel`` of ``google_adk_models.py``; spans and metrics go to the session's in-memory SDK
(tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from google.adk.agents import LlmAgent, ParallelAgent, SequentialAgent
from google.adk.tools.agent_tool import AgentTool
from google.adk.tools.tool_context import ToolContext
from google_adk_models import ScriptedModel, ToolCalls, agents_as_tools, final_text, run
from google_adk_spans import decisions, guard_spans, parent_of
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otel_guard
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from tests.conventions import assert_follows
from tests.hop_spans import assert_observe_mode_recorded_the_loop
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(GoogleADKInstrumentor)


# -- the loop -----------------------------------------------------------------------------------


async def test_an_agent_runs_session_is_its_conversation_and_the_hops_follow_the_conventions(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    await run(agents_as_tools().planner)

    ours = guard_spans(spans)
    adk_own = {
        s.name: dict(s.attributes or {})["gen_ai.conversation.id"]
        for s in spans.all()
        if s.name.startswith("invoke_agent ") and s not in ours
    }
    (first,) = [s for s in ours if dict(s.attributes or {})["otel_guard.chain.depth"] == 1]
    # The run's session, as ADK's own span of the run says. An agent called as a tool (budget) runs
    # in a session AgentTool makes only after the hop was decided: that hop names none.
    assert dict(first.attributes or {})["gen_ai.conversation.id"] == adk_own["invoke_agent planner"]
    for span in ours:
        available = {"gen_ai.conversation.id"} if span is first else set()
        if dict(span.attributes or {})["otel_guard.decision"] == "refuse":
            available.add("error.type")
        assert_follows(span, available=available)


async def test_agents_asking_each_other_as_tools_stop_at_the_first_bounce_and_answer(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = agents_as_tools()

    events = await run(pair.planner)

    # planner -> budget was allowed, budget -> planner refused (the default agent_skill rule: planner
    # with no skill is already on the path). Two tool calls in all, and both agents answered.
    assert pair.tool_calls.left == 6 - 2
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    # The budget model read the refusal as ADK's tool error: a function response {"error": ...}.
    (error,) = pair.budget_model.errors
    assert error.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): ")
    assert "Delegation cycle: agent planner is already in chain planner → budget" in error
    assert "do not call it again" in error
    assert len(pair.budget_model.requests) == 2  # the tool call, then the answer after the error
    assert len(pair.planner_model.requests) == 2  # the planner ran once: it was never re-entered
    assert final_text(events) == "planner answers after budget ok"
    refused = guard_spans(spans)[-1]
    assert refused.attributes is not None
    assert refused.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refused.events] == ["otel_guard.refused"]


async def test_without_the_guard_the_agents_bounce_until_the_scripts_give_up(spans: Any) -> None:
    pair = agents_as_tools()

    events = await run(pair.planner)

    assert pair.tool_calls.left == 0
    assert pair.budget_model.errors == []
    assert guard_spans(spans) == []
    assert final_text(events) == "planner answers after budget ok"


async def test_an_agent_that_has_itself_as_a_tool_is_refused_at_its_first_call(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    planner = LlmAgent(
        name="planner", model=ScriptedModel(agent="planner", tool="planner", tool_calls=ToolCalls(3))
    )
    planner.tools.append(AgentTool(planner))

    events = await run(planner)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent planner", "refuse", ("planner", "planner")),
    ]
    assert final_text(events) == "planner answers after planner error"


async def test_an_agent_run_refused_outside_any_tool_raises_before_its_model_is_called(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = agents_as_tools()

    on_the_path = "agent planner is already in chain planner → coordinator"
    with (
        otel_guard.delegate("planner"),
        otel_guard.delegate("coordinator"),
        pytest.raises(otel_guard.DelegationRefused, match=on_the_path),
    ):
        await run(pair.planner)

    assert pair.planner_model.requests == []
    assert decisions(spans)[-1] == ("invoke_agent planner", "refuse", ("planner", "coordinator", "planner"))


async def test_a_run_inside_a_hop_of_its_own_name_is_that_hop(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    # The code around the run already made it a hop (an A2A server, a tool named like the agent, or
    # by hand): the same call, not a second hop of the same name.
    pair = agents_as_tools(max_tool_calls=1)

    with otel_guard.delegate("planner"):
        await run(pair.planner)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),  # the one made by hand
        ("invoke_agent budget", "allow", ("planner", "budget")),
    ]


async def test_workflow_agents_runs_are_hops_and_siblings_are_no_cycle(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    def worker(name: str) -> LlmAgent:
        return LlmAgent(name=name, model=ScriptedModel(agent=name))

    pipeline = SequentialAgent(
        name="pipeline",
        sub_agents=[
            worker("research"),
            ParallelAgent(name="fan_out", sub_agents=[worker("fx"), worker("hotels")]),
        ],
    )

    await run(pipeline)

    assert sorted(decisions(spans)) == [
        ("invoke_agent fan_out", "allow", ("pipeline", "fan_out")),
        ("invoke_agent fx", "allow", ("pipeline", "fan_out", "fx")),
        ("invoke_agent hotels", "allow", ("pipeline", "fan_out", "hotels")),
        ("invoke_agent pipeline", "allow", ("pipeline",)),
        ("invoke_agent research", "allow", ("pipeline", "research")),
    ]


# -- function tools -----------------------------------------------------------------------------


def planner_with_lookup(bodies: list[str], tool_calls: int = 1, parallel: int = 1) -> LlmAgent:
    async def lookup(city: str) -> str:
        """Look up the weather of a city."""
        bodies.append(city)
        return f"{city}: sunny"

    model = ScriptedModel(
        agent="planner",
        tool="lookup",
        tool_args={"city": "Lisbon"},
        tool_calls=ToolCalls(tool_calls),
        parallel=parallel,
    )
    return LlmAgent(name="planner", model=model, tools=[lookup])


async def test_a_function_tool_call_is_a_hop_inside_adks_own_tool_span(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    bodies: list[str] = []
    planner = planner_with_lookup(bodies)

    events = await run(planner)

    assert bodies == ["Lisbon"]
    assert final_text(events) == "planner answers after lookup ok"
    tool = next(s for s in guard_spans(spans) if s.name == "execute_tool lookup")
    assert dict(tool.attributes or {}) | {"otel_guard.chain.root": "<root>"} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "otel_guard.chain.agents": ("planner", "lookup"),
        "otel_guard.chain.skills": ("", ""),
        "otel_guard.chain.root": "<root>",
        "otel_guard.chain.depth": 2,
        "otel_guard.name_depth": 1,
        "otel_guard.decision": "allow",
        "otel_guard.mode": "enforce",
        "otel_guard.hop.kind": "call",
        "otel_guard.budget.hops": 2,
    }
    # ADK opens its own span of the call before the plugin's callback: ours is its direct child.
    adk_tool = parent_of(tool, spans)
    assert adk_tool.name == "execute_tool lookup"
    assert "otel_guard.decision" not in (adk_tool.attributes or {})


async def test_a_refused_function_tool_never_runs_its_body_and_the_model_reads_why(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    bodies: list[str] = []
    planner = planner_with_lookup(bodies)

    with otel_guard.delegate("lookup"):  # a chain that already holds lookup: calling it is a cycle
        events = await run(planner)

    assert bodies == []
    assert decisions(spans)[-1] == ("execute_tool lookup", "refuse", ("lookup", "planner", "lookup"))
    (error,) = planner.model.errors  # type: ignore[union-attr]
    assert "Delegation cycle: agent lookup is already in chain lookup → planner" in error
    assert final_text(events) == "planner answers after lookup error"


async def test_parallel_calls_of_one_tool_are_sibling_hops_not_a_cycle(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    bodies: list[str] = []
    planner = planner_with_lookup(bodies, parallel=3)

    await run(planner)

    assert bodies == ["Lisbon"] * 3
    tools = [d for d in decisions(spans) if d[0] == "execute_tool lookup"]
    assert tools == [("execute_tool lookup", "allow", ("planner", "lookup"))] * 3


async def test_a_call_of_a_tool_the_agent_does_not_have_is_no_hop(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    planner = LlmAgent(
        name="planner", model=ScriptedModel(agent="planner", tool="no_such_tool", tool_calls=ToolCalls(1))
    )

    events = await run(planner)

    # ADK answers the made-up call itself, in the same error form; nothing was delegated.
    assert "no tool with that name is available" in planner.model.errors[0]  # type: ignore[union-attr]
    assert decisions(spans) == [("invoke_agent planner", "allow", ("planner",))]
    assert final_text(events) == "planner answers after no_such_tool error"


async def test_a_tool_whose_own_agent_run_is_refused_answers_with_the_refusal(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    # Tools that run the other agent in a runner of their own (not AgentTool): the run inside
    # ask_planner is refused, and the tool's error response carries the refusal.
    pair = agents_as_tools()

    async def ask_budget(question: str) -> str:
        """Ask the budget agent."""
        return final_text(await run(pair.budget, question))

    async def ask_planner(question: str) -> str:
        """Ask the planner agent."""
        return final_text(await run(pair.planner, question))

    pair.planner.tools = [ask_budget]
    pair.budget.tools = [ask_planner]
    for agent, tool in ((pair.planner, "ask_budget"), (pair.budget, "ask_planner")):
        model: ScriptedModel = agent.model  # type: ignore[assignment]
        model.tool, model.tool_args = tool, {"question": "what does it cost?"}

    events = await run(pair.planner)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]
    (error,) = pair.budget_model.errors
    assert "already in chain planner → ask_budget → budget → ask_planner" in error
    assert len(pair.planner_model.requests) == 2  # the refused run never reached the model
    assert final_text(events) == "planner answers after ask_budget ok"
    ask_planner_span = next(s for s in guard_spans(spans) if s.name == "execute_tool ask_planner")
    assert ask_planner_span.attributes is not None
    assert ask_planner_span.attributes["error.type"] == "DelegationRefused"


async def test_a_function_tool_named_like_the_agent_it_runs_is_one_hop(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = agents_as_tools(max_tool_calls=1)

    async def budget(request: str) -> str:
        """Ask the budget agent (a tool of its own, named after the agent it runs)."""
        return final_text(await run(pair.budget, request))

    pair.planner.tools = [budget]

    events = await run(pair.planner)

    # The tool call is the delegation to agent budget: its run joins the call's hop.
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
    ]
    assert final_text(events) == "planner answers after budget ok"


async def test_a_tool_that_reads_the_chain_sees_its_own_hop(instrumented: GoogleADKInstrumentor) -> None:
    seen: list[tuple[str, ...]] = []

    def where_am_i(tool_context: ToolContext) -> str:
        """Say where the call runs."""
        chain = otel_guard.current_chain()
        seen.append(tuple(h.agent for h in chain.hops) if chain else ())
        return "here"

    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(agent="planner", tool="where_am_i", tool_args={}, tool_calls=ToolCalls(1)),
        tools=[where_am_i],
    )

    await run(planner)

    assert seen == [("planner", "where_am_i")]


# -- observe mode, suppression, metrics ---------------------------------------------------------


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: GoogleADKInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(mode="observe", max_depth=32, max_name_depth=32)
    pair = agents_as_tools(max_tool_calls=4)

    events = await run(pair.planner)

    assert pair.tool_calls.left == 0  # nothing refused: the scripts bounded the loop
    assert pair.budget_model.errors == []
    assert final_text(events) == "planner answers after budget ok"
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


async def test_decisions_and_depths_are_counted(
    instrumented: GoogleADKInstrumentor, metric_reader: Any
) -> None:
    def depths() -> tuple[int, float]:
        points = [point for _, point in metric_reader.points("otel_guard.chain.depth")]
        return sum(p.count for p in points), sum(p.sum for p in points)

    count_before, sum_before = depths()  # the reader's counts are the process's: compare
    await run(planner_with_lookup([]))

    decided = {
        (attrs.get("otel_guard.decision"), attrs.get("gen_ai.agent.name"), attrs.get("gen_ai.tool.name"))
        for attrs, _ in metric_reader.points("otel_guard.decisions")
    }
    assert {("allow", "planner", None), ("allow", None, "lookup")} <= decided
    count_after, sum_after = depths()
    assert (count_after - count_before, sum_after - sum_before) == (2, 1 + 2)  # planner, then lookup


async def test_suppressed_instrumentation_makes_no_hops(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = agents_as_tools(max_tool_calls=3)

    with suppress_instrumentation():
        await run(pair.planner)

    assert pair.tool_calls.left == 0  # nothing stopped the loop
    assert guard_spans(spans) == []
