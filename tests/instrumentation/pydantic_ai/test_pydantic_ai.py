"""pydantic-ai under otel-guard: runs and tool calls are hops, and a refusal reaches the model.

The agents are real pydantic-ai agents driven by offline ``FunctionModel`` scripts (see
``pydantic_ai_app.py``); spans and metrics go to the session's in-memory SDK (tests/conftest.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import wrapt
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai_app import build_loop

import otel_guard
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.pydantic_ai import PATCH_TARGETS, PydanticAIInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_loop, chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

GUARD_ATTRIBUTES = "otel_guard.decision"


instrumented = instrumentor_fixture(PydanticAIInstrumentor)


def guard_spans(spans: Any) -> list[ReadableSpan]:
    """Our hop spans (the ones carrying the contract's otel_guard.* attributes), oldest end first."""
    return [s for s in spans.all() if s.attributes and GUARD_ATTRIBUTES in s.attributes]


def decisions(spans: Any) -> list[tuple[str, str, tuple[str, ...]]]:
    """(span name, decision, chain agents) of every hop span, in the order the hops started."""
    hops = sorted(guard_spans(spans), key=lambda s: s.start_time or 0)
    return [
        (
            s.name,
            str(s.attributes["otel_guard.decision"]),
            chain_of(s, spans)[0],
        )  # a nested hop's: its parent's
        for s in hops
    ]


# -- the loop -----------------------------------------------------------------------------------


async def test_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    result = await loop.planner.run("Plan the team offsite")

    # The bounce budget -> planner was refused: the planner ran once (two model requests: the tool
    # call and the answer), never a second time, and both runs finished with an answer.
    assert loop.planner_model.runs == 1
    assert len(loop.planner_model.requests) == 2
    assert loop.budget_model.runs == 1
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert result.output == "planner answers after ask_budget success"

    # The budget model received the refusal as a failed tool result: reason, path, do not retry.
    (refusal,) = loop.budget_model.tool_results
    assert refusal.tool_name == "ask_planner"
    assert refusal.outcome == "failed"
    text = str(refusal.content)
    assert "a2a_delegation_cycle" in text
    assert "reason: cycle" in text
    assert "planner → ask_budget → budget → ask_planner" in text
    assert "do not call it again" in text
    # What a provider sends to the model for it: pydantic-ai's error form, carrying the same text.
    assert json.loads(refusal.model_response_str()) == {"error": text}

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]
    refused = [s for s in guard_spans(spans) if s.attributes["otel_guard.decision"] == "refuse"]
    assert refused[0].attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refused[0].events] == ["otel_guard.refused"]


async def test_a_tool_named_like_its_agent_is_one_hop_and_is_refused_before_its_body(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    # Tools named after the agent they run: calling tool `budget` is the delegation to agent budget.
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    result = await loop.planner.run("Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    # The refused tool's body never ran; the model got the refusal and both runs answered.
    assert loop.tool_bodies == {"budget": 1}
    (refusal,) = loop.budget_model.tool_results
    assert refusal.outcome == "failed"
    assert "planner → budget" in str(refusal.content)
    assert result.output == "planner answers after budget success"


async def test_default_rule_refuses_the_repeated_tool_call_of_a_loop(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    # Under the default agent_skill rule the loop still ends: the first repeated (name, skill) is the
    # planner's second run, inside the second ask_planner call.
    loop = build_loop()

    result = await loop.planner.run("Plan the team offsite")

    assert loop.planner_model.runs == 1
    assert result.output == "planner answers after ask_budget success"
    assert decisions(spans)[-1] == (
        "invoke_agent planner",
        "refuse",
        ("planner", "ask_budget", "budget", "ask_planner", "planner"),
    )


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: PydanticAIInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe", max_depth=32, max_name_depth=32)
    loop = build_loop(max_tool_calls=2)

    result = await loop.planner.run("Plan the team offsite")

    # Nothing refused: the scripted models bound the bouncing (two tool calls each).
    assert loop.planner_model.runs == 3
    assert loop.budget_model.runs == 2
    assert all(part.outcome == "success" for part in loop.budget_model.tool_results)
    assert result.output == "planner answers after ask_budget success"

    assert_observe_mode_recorded_the_loop(spans, metric_reader)


# -- spans --------------------------------------------------------------------------------------


async def test_spans_carry_the_contract_attributes_and_nest(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=1)

    await loop.planner.run("Plan the team offsite")

    agent = spans.one("invoke_agent budget")
    tool = spans.one("execute_tool ask_budget")
    (root,) = [s for s in spans.named("invoke_agent planner") if s.attributes["otel_guard.chain.depth"] == 1]
    assert dict(tool.attributes or {}) | {"otel_guard.chain.root": "<root>"} == {
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
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "budget"
    assert agent.attributes["otel_guard.chain.depth"] == 3
    # Nested in the previous hop's span, the tool and the agent hop leave the chain's lists out.
    assert chain_of(tool, spans) == (("planner", "ask_budget"), ("", ""))
    assert chain_of(agent, spans)[0] == ("planner", "ask_budget", "budget")
    roots = {s.attributes["otel_guard.chain.root"] for s in (root, tool, agent)}
    assert len(roots) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", str(roots.pop()))
    # One trace: planner run -> ask_budget call -> budget run.
    assert tool.parent is not None
    assert tool.parent.span_id == root.context.span_id
    assert agent.parent is not None
    assert agent.parent.span_id == tool.context.span_id
    assert {s.context.trace_id for s in (root, tool, agent)} == {root.context.trace_id}


async def test_pydantic_ai_own_spans_nest_under_ours_without_duplicating_the_hop(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(pydantic_ai_spans=True)

    await loop.planner.run("Plan the team offsite")

    ours = {s.context.span_id: s for s in guard_spans(spans)}
    allowed = [s for s in ours.values() if s.attributes["otel_guard.decision"] == "allow"]
    assert len(allowed) == 4
    theirs = [s for s in spans.all() if s.context.span_id not in ours]
    for hop in allowed:
        # Exactly one span of pydantic-ai's per allowed hop, same name, directly under ours.
        (child,) = [
            s
            for s in theirs
            if s.parent is not None and s.parent.span_id == hop.context.span_id and s.name == hop.name
        ]
        assert not any(key.startswith("otel_guard.") for key in child.attributes or {})
    # The refused run never started, so pydantic-ai made no span for it.
    assert len([s for s in theirs if s.name == "invoke_agent planner"]) == 1
    assert len({s.context.trace_id for s in spans.all()}) == 1


async def test_every_entry_point_makes_one_hop_per_run(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    # TestModel: pydantic-ai's offline model that also streams.
    solo = Agent(TestModel(custom_output_text="done"), name="solo")

    await solo.run("a")
    async with solo.run_stream("b") as streamed:
        await streamed.get_output()
    async with solo.iter("c") as run:
        async for _node in run:
            pass
    async with solo.run_stream_events("d") as events:
        async for _event in events:
            pass

    runs = spans.named("invoke_agent solo")
    assert len(runs) == 4
    assert all(s.attributes["otel_guard.chain.depth"] == 1 for s in runs)


def test_the_sync_entry_points_make_one_hop_per_run(instrumented: PydanticAIInstrumentor, spans: Any) -> None:
    solo = Agent(TestModel(custom_output_text="done"), name="solo")

    assert solo.run_sync("a").output == "done"
    with solo.run_stream_sync("b") as streamed:
        assert streamed.get_output() == "done"

    assert [s.attributes["otel_guard.chain.agents"] for s in spans.named("invoke_agent solo")] == [
        ("solo",)
    ] * 2


async def test_a_sync_tool_runs_inside_its_hop(instrumented: PydanticAIInstrumentor) -> None:
    # pydantic-ai runs sync tools in a worker thread: the chain must follow the call there.
    seen: list[tuple[str, ...]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(parts=[ToolCallPart("lookup", {"key": "a"})])

    def lookup(key: str) -> str:
        chain = otel_guard.current_chain()
        assert chain is not None
        seen.append(tuple(hop.agent for hop in chain.hops))
        return key

    await Agent(FunctionModel(model), name="searcher", tools=[lookup]).run("find")

    assert seen == [("searcher", "lookup")]


async def test_an_unnamed_agent_is_named_as_pydantic_ai_infers_it(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    helper = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("done")])))

    async with helper.iter("a") as run:
        async for _node in run:
            pass

    assert helper.name == "helper"
    assert spans.one("invoke_agent helper").attributes["gen_ai.agent.name"] == "helper"


async def test_parallel_tool_calls_are_siblings_not_a_cycle(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    calls = 0

    def two_lookups(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            return ModelResponse(parts=[TextPart("both looked up")])
        return ModelResponse(
            parts=[ToolCallPart("lookup", {"key": "a"}), ToolCallPart("lookup", {"key": "b"})]
        )

    async def lookup(key: str) -> str:
        nonlocal calls
        calls += 1
        return key.upper()

    agent = Agent(FunctionModel(two_lookups), name="searcher", tools=[lookup])
    assert (await agent.run("find")).output == "both looked up"

    assert calls == 2
    lookups = spans.named("execute_tool lookup")
    assert [chain_of(s, spans)[0] for s in lookups] == [("searcher", "lookup")] * 2
    assert {s.attributes["otel_guard.decision"] for s in lookups} == {"allow"}


async def test_a_refused_run_outside_any_tool_raises_before_the_model_is_called(
    instrumented: PydanticAIInstrumentor,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    requests: list[list[ModelMessage]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(messages)
        return ModelResponse(parts=[TextPart("done")])

    planner = Agent(FunctionModel(model), name="planner")
    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused) as refused:
        await planner.run("again")

    assert refused.value.reason == "cycle"
    assert requests == []


# -- suppression and uninstrument ---------------------------------------------------------------


async def test_suppressed_instrumentation_makes_no_hop(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(max_tool_calls=2)

    with suppress_instrumentation():
        result = await loop.planner.run("Plan the team offsite")

    # Unguarded: the loop bounced until the scripted models stopped it.
    assert loop.planner_model.runs == 3
    assert result.output == "planner answers after ask_budget success"
    assert guard_spans(spans) == []


async def test_uninstrument_restores_pydantic_ai(spans: Any) -> None:
    from pydantic_ai.agent import Agent as AgentClass
    from pydantic_ai.tool_manager import ToolManager

    instrumentor = PydanticAIInstrumentor()
    instrumentor.instrument()
    assert isinstance(AgentClass.__dict__["iter"], wrapt.FunctionWrapper)
    instrumentor.uninstrument()

    assert not isinstance(AgentClass.__dict__["iter"], wrapt.ObjectProxy)
    assert not isinstance(ToolManager.__dict__["execute_tool_call"], wrapt.ObjectProxy)
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(max_tool_calls=2)
    result = await loop.planner.run("Plan the team offsite")

    # The same loop now runs unguarded, bounded only by the scripted models.
    assert loop.planner_model.runs == 3
    assert all(part.outcome == "success" for part in loop.budget_model.tool_results)
    assert result.output == "planner answers after ask_budget success"
    assert guard_spans(spans) == []


def test_every_patch_target_exists_in_the_installed_pydantic_ai() -> None:
    for target in PATCH_TARGETS:
        assert callable(resolve(target)), target


def test_dependency_range_matches_the_installed_version() -> None:
    assert PydanticAIInstrumentor()._check_dependency_conflicts() is None


# -- situational guidance -----------------------------------------------------------------------


def self_named_agent(requests: list[tuple[list[ModelMessage], AgentInfo]]) -> Agent[None, str]:
    """An agent `researcher` that can see a tool `researcher` (itself), and answers without it."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append((messages, info))
        return ModelResponse(parts=[TextPart("researched")])

    async def researcher(topic: str) -> str:
        """Research a topic in depth and report."""
        return topic

    return Agent(
        FunctionModel(model),
        name="researcher",
        instructions="You are a careful researcher.",
        system_prompt="Shared system prefix.",
        tools=[Tool(researcher)],
    )


def user_prompt_of(messages: list[ModelMessage]) -> object:
    (request,) = [m for m in messages if isinstance(m, ModelRequest)]
    (prompt,) = [p for p in request.parts if isinstance(p, UserPromptPart)]
    return prompt.content


def system_text(messages: list[ModelMessage], info: AgentInfo) -> str:
    parts = [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, SystemPromptPart)
    ]
    return "\n".join([*parts, info.instructions or ""])


async def test_situational_prefix_leads_the_user_turn_of_an_agent_that_sees_itself(
    instrumented: PydanticAIInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    requests: list[tuple[list[ModelMessage], AgentInfo]] = []

    await self_named_agent(requests).run("Find sources on ant colonies")

    ((messages, info),) = requests
    expected = otel_guard.situational_prefix("researcher", "Research a topic in depth and report.")
    assert user_prompt_of(messages) == f"{expected}\n\nFind sources on ant colonies"
    assert "do NOT call it" not in system_text(messages, info)
    assert "You are a careful researcher." in system_text(messages, info)


async def test_situational_prefix_leads_a_multi_part_user_turn(instrumented: PydanticAIInstrumentor) -> None:
    otel_guard.configure(situational_prompt=True)
    requests: list[tuple[list[ModelMessage], AgentInfo]] = []

    await self_named_agent(requests).run(["Find sources", "on ant colonies"])

    ((messages, _info),) = requests
    expected = otel_guard.situational_prefix("researcher", "Research a topic in depth and report.")
    assert user_prompt_of(messages) == [expected, "Find sources", "on ant colonies"]


@pytest.mark.parametrize("enabled", [False, True])
async def test_no_situational_prefix_when_off_or_when_the_agent_cannot_see_itself(
    instrumented: PydanticAIInstrumentor, enabled: bool
) -> None:
    otel_guard.configure(situational_prompt=enabled)
    requests: list[tuple[list[ModelMessage], AgentInfo]] = []

    if enabled:
        # On, but the agent's tools do not include its own name.
        loop = build_loop(max_tool_calls=0)
        await loop.planner.run("Plan the team offsite")
        assert user_prompt_of(loop.planner_model.requests[0]) == "Plan the team offsite"
    else:
        await self_named_agent(requests).run("Find sources on ant colonies")
        assert user_prompt_of(requests[0][0]) == "Find sources on ant colonies"


async def test_a_raw_dispatch_gets_the_refusal_as_pydantic_ai_tool_failed(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    # A dispatcher tool (as code mode's sandbox does) calls another tool through the ToolManager with
    # wrap_validation_errors=False: the refusal comes back raw, as the ToolFailed pydantic-ai uses.
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"done: {returned[0].content}")])
        return ModelResponse(parts=[ToolCallPart("dispatch", {"tool": "planner"})])

    async def dispatch(ctx: RunContext[None], tool: str) -> str:
        assert ctx.tool_manager is not None
        try:
            await ctx.tool_manager.handle_call(ToolCallPart(tool, {}), wrap_validation_errors=False)
        except ToolFailed as failed:
            return f"dispatch failed: {failed.message}"
        return "dispatched"

    async def planner_tool() -> str:
        ran.append("planner")
        return "re-entered"

    agent = Agent(
        FunctionModel(model),
        name="planner",
        tools=[Tool(dispatch, takes_ctx=True), Tool(planner_tool, name="planner")],
    )
    result = await agent.run("go")

    assert ran == []
    assert result.output.startswith("done: dispatch failed: Refused by otel-guard (a2a_delegation_cycle")
    assert decisions(spans)[-1] == ("execute_tool planner", "refuse", ("planner", "dispatch", "planner"))


async def test_situational_prefix_names_the_path_to_an_agent_that_can_call_its_caller(
    instrumented: PydanticAIInstrumentor,
) -> None:
    """budget runs in planner's `budget` tool and can see a `planner` tool: it is told the path
    planner → budget and that calling planner is refused too."""
    otel_guard.configure(situational_prompt=True)
    loop = build_loop(planner_tool="budget", budget_tool="planner", max_tool_calls=1)

    await loop.planner.run("Plan the team offsite")

    prefix = otel_guard.situational_prefix("budget", "", path=["planner", "budget"])
    assert "planner → budget" in prefix
    assert "do NOT call `planner` either" in prefix
    assert user_prompt_of(loop.budget_model.requests[0]) == f"{prefix}\n\nfrom planner"
    # planner, at the root, can see only budget, which is not on its path.
    assert user_prompt_of(loop.planner_model.requests[0]) == "Plan the team offsite"
