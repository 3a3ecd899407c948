"""Haystack under otel-guard: Agent runs, tool calls and agents as tools are hops, and a refusal
reaches the model as Haystack's own tool error, with its text.

The agents are real Haystack ``Agent`` components on a scripted chat generator (a real
``@component``, see ``haystack_loop.py``); spans and metrics go to the session's in-memory SDK.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from haystack import Pipeline
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from haystack.tools import AgentTool, PipelineTool, Tool
from haystack.tools.errors import ToolInvocationError
from haystack_loop import CallBudget, ScriptedChatGenerator, agent_loop, function_loop, task
from instrumentors import instrumentor_fixture
from opentelemetry.instrumentation.utils import suppress_instrumentation

import otel_guard
from otel_guard.instrumentation.haystack import HaystackInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_loop, decisions, guard_spans, refused

instrumented = instrumentor_fixture(HaystackInstrumentor)

REFUSED = "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:"
HAYSTACK_WRAPPING = "Failed to invoke Tool"  # Haystack's own text around a tool's exception


def chain_of() -> tuple[str, ...]:
    chain = otel_guard.current_chain()
    return tuple(hop.agent for hop in chain.hops) if chain else ()


def lookup_tool(seen: list[tuple[str, ...]]) -> Tool:
    schema = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}
    return Tool(
        name="lookup",
        description="Look something up.",
        parameters=schema,
        function=lambda question: seen.append(chain_of()) or "found",
    )


# -- the loop through agents as tools -----------------------------------------------------------


def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    loop = agent_loop()

    result = loop.run()

    # planner asked budget; budget's call back into planner was refused before the planner ran.
    assert (loop.runs("planner"), loop.runs("budget"), loop.calls.made) == (1, 1, 2)
    assert result["exit_reason"] == "text"
    assert result["last_message"].text.startswith(f"planner answers after budget answers after {REFUSED}")

    # The budget model got the refusal as Haystack's error tool result: reason, path, do not retry.
    (text,) = loop.tool_results("budget")
    assert text.startswith(REFUSED)
    assert "agent planner is already in chain planner → budget." in text
    assert "do not call it again" in text
    assert HAYSTACK_WRAPPING not in text
    budget_request = loop.models_of("budget")[0].requests[-1]
    assert budget_request[-1] == ("tool", text)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]
    assert len({span.context.trace_id for span in guard_spans(spans)}) == 1


def test_the_error_result_is_haystacks_own(instrumented: HaystackInstrumentor) -> None:
    loop = agent_loop()
    seen: list[ChatMessage] = []
    budget_model = loop.models_of("budget")[0]
    answer = budget_model.run

    def recording(messages: list[ChatMessage], tools: Any = None, **kwargs: Any) -> dict[str, Any]:
        seen.extend(messages)
        return answer(messages, tools, **kwargs)

    budget_model.run = recording  # type: ignore[method-assign]
    loop.run()

    (result,) = [m.tool_call_result for m in seen if m.tool_call_result is not None]
    assert result.error is True
    assert result.origin.tool_name == "planner"


def test_a_healthy_run_is_unchanged(instrumented: HaystackInstrumentor, spans: Any) -> None:
    guarded = agent_loop(depth=2).run()
    instrumented.uninstrument()
    plain = agent_loop(depth=2).run()
    instrumented.instrument()

    assert guarded["last_message"].text == plain["last_message"].text
    assert guarded["last_message"].text == "planner answers after budget answers without tools"
    assert [d[:2] for d in decisions(spans)] == [
        ("invoke_agent planner", "allow"),
        ("invoke_agent budget", "allow"),
    ]


def test_the_agent_rule_stops_the_loop_at_the_same_bounce(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = agent_loop()

    loop.run()

    assert loop.calls.made == 2
    assert decisions(spans)[-1][:2] == ("invoke_agent planner", "refuse")


def test_observe_mode_lets_the_loop_through_and_records_it(
    instrumented: HaystackInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(mode="observe")
    loop = agent_loop()

    loop.run()

    assert loop.calls.made == 6  # the scripts' own bound
    assert all(not text.startswith("Refused") for text in loop.tool_results("budget"))
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


def test_run_async_is_guarded_the_same_way(instrumented: HaystackInstrumentor, spans: Any) -> None:
    loop = agent_loop()

    result = asyncio.run(loop.run_async())

    # Outside a pipeline the top Agent has no name of its own: its class name.
    assert [d[:2] for d in decisions(spans)] == [
        ("invoke_agent Agent", "allow"),
        ("invoke_agent budget", "allow"),
        ("invoke_agent planner", "allow"),
        ("invoke_agent budget", "refuse"),
    ]
    (text,) = [t for t in loop.tool_results("planner") if t.startswith("Refused")]
    assert "agent budget is already in chain Agent → budget → planner." in text
    assert result["exit_reason"] == "text"


def test_function_tools_that_run_unnamed_agents_are_those_agents_calls(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    loop = function_loop()

    result = loop.run(pipeline=False)

    # An Agent with no name runs as the call of the tool whose body runs it: one hop a bounce. With
    # no names, the loop shows at the first call that comes back: ask_budget, one bounce later.
    assert decisions(spans) == [
        ("invoke_agent Agent", "allow", ("Agent",)),
        ("execute_tool ask_budget", "allow", ("Agent", "ask_budget")),
        ("execute_tool ask_planner", "allow", ("Agent", "ask_budget", "ask_planner")),
        ("execute_tool ask_budget", "refuse", ("Agent", "ask_budget", "ask_planner", "ask_budget")),
    ]
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert result["last_message"].text.startswith("planner answers after budget answers after planner")


# -- pipelines as tools -------------------------------------------------------------------------


def test_a_pipeline_tool_is_a_tool_hop_and_its_agent_a_hop_inside(
    instrumented: HaystackInstrumentor, spans: Any
) -> None:
    calls = CallBudget(6)
    inner_model = ScriptedChatGenerator("planner", "ask_budget", calls, arguments=task("again"))
    inner = Pipeline()
    # The pipeline's agent is the planner again, with the same tool: the loop goes through a pipeline.
    top_model = ScriptedChatGenerator("planner", "ask_budget", calls, arguments=task("first"))
    inner.add_component("planner", Agent(chat_generator=inner_model, tools=[]))
    ask_budget = PipelineTool(
        pipeline=inner,
        name="ask_budget",
        description="Ask the budget pipeline.",
        input_mapping={"messages": ["planner.messages"]},
        output_mapping={"planner.last_message": "last_message"},
    )
    top = Pipeline()
    top.add_component("planner", Agent(chat_generator=top_model, tools=[ask_budget]))

    result = top.run({"planner": {"messages": [ChatMessage.from_user("plan")]}})["planner"]

    assert [d[:2] for d in decisions(spans)] == [
        ("invoke_agent planner", "allow"),
        ("execute_tool ask_budget", "allow"),
        ("invoke_agent planner", "refuse"),
    ]
    # The refusal of the Agent inside the pipeline reached the top model as the tool's error.
    (text,) = top_model.tool_results
    assert text.startswith(REFUSED)
    assert "agent planner is already in chain planner → ask_budget." in text
    assert HAYSTACK_WRAPPING not in text
    assert inner_model.requests == []
    assert result["exit_reason"] == "text"


# -- what is a hop ------------------------------------------------------------------------------


def test_parallel_tool_calls_are_siblings_not_a_cycle(instrumented: HaystackInstrumentor, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[tuple[str, ...]] = []
    model = ScriptedChatGenerator(
        "searcher", "lookup", CallBudget(3), arguments={"question": "q"}, parallel=3
    )
    pipe = Pipeline()
    pipe.add_component("searcher", Agent(chat_generator=model, tools=[lookup_tool(seen)]))

    pipe.run({"searcher": {"messages": [ChatMessage.from_user("find")]}})

    assert seen == [("searcher", "lookup")] * 3
    assert [d for d in decisions(spans) if d[0] == "execute_tool lookup"] == [
        ("execute_tool lookup", "allow", ("searcher", "lookup"))
    ] * 3


def test_a_direct_tool_call_is_a_hop(instrumented: HaystackInstrumentor) -> None:
    seen: list[tuple[str, ...]] = []

    assert lookup_tool(seen).invoke(question="q") == "found"
    assert asyncio.run(lookup_tool(seen).invoke_async(question="q")) == "found"  # one hop, not two

    assert seen == [("lookup",), ("lookup",)]


def test_a_refused_direct_call_raises_haystacks_tool_error(instrumented: HaystackInstrumentor) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[tuple[str, ...]] = []
    with (
        otel_guard.delegate("lookup"),
        pytest.raises(ToolInvocationError, match=r"^Refused by otel-guard") as e,
    ):
        lookup_tool(seen).invoke(question="q")
    assert isinstance(e.value.__cause__, otel_guard.DelegationRefused)
    assert seen == []


def test_raise_on_tool_invocation_failure_raises_the_refusal_from_the_run(
    instrumented: HaystackInstrumentor,
) -> None:
    loop = agent_loop(depth=3)
    budget_tool = loop.top.tools[0]
    assert isinstance(budget_tool, AgentTool)
    for agent in (loop.top, budget_tool._component):
        agent.raise_on_tool_invocation_failure = True

    with pytest.raises(Exception, match="Refused by otel-guard") as e:
        loop.run()
    assert otel_guard.DelegationRefused in {type(x) for x in _causes(e.value)}


def _causes(error: BaseException | None) -> list[BaseException]:
    found = []
    while error is not None:
        found.append(error)
        error = error.__cause__
    return found


# -- suppression and uninstrument ---------------------------------------------------------------


def test_suppressed_instrumentation_makes_no_hop(instrumented: HaystackInstrumentor, spans: Any) -> None:
    loop = agent_loop()
    with suppress_instrumentation():
        loop.run()
    assert guard_spans(spans) == []
    assert loop.calls.made == 6


def test_uninstrument_removes_the_guard(instrumented: HaystackInstrumentor, spans: Any) -> None:
    instrumented.uninstrument()
    loop = agent_loop()
    loop.run()
    instrumented.instrument()
    assert guard_spans(spans) == []
    assert loop.calls.made == 6
