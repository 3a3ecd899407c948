"""What is a hop in CrewAI: each agent run (every entry point, once), each tool call, in one trace.

Real agents, crews and tools driven by offline scripted models (``crewai_app.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import json
import re
from typing import Any

import pytest
import wrapt
from crewai import Agent, Crew, Task
from crewai.tools import BaseTool
from crewai_app import Question, ScriptedLLM, agent, build_loop
from opentelemetry.instrumentation.utils import suppress_instrumentation
from pydantic import Field

import otel_guard
from tests.hop_spans import chain_of, decisions, guard_spans


class Lookup(BaseTool):
    """A plain tool that notes the chain its body runs in (CrewAI may run it in a worker thread)."""

    name: str = "lookup"
    description: str = "Look something up."
    args_schema: type[Question] = Question
    chains: list[tuple[str, ...]] = Field(default_factory=list)

    def _run(self, question: str, **kwargs: Any) -> str:
        chain = otel_guard.current_chain()
        self.chains.append(tuple(hop.agent for hop in chain.hops) if chain else ())
        return f"{question}: found"


def searcher(model: ScriptedLLM | None = None) -> tuple[Agent, Lookup]:
    lookup = Lookup()
    model = model or ScriptedLLM(model="scripted", agent="searcher", tool="lookup", max_tool_calls=1)
    return agent("searcher", model, [lookup]), lookup


# -- spans ----------------------------------------------------------------------------------------


def test_spans_carry_the_contract_attributes_and_nest_in_one_trace(instrumented: Any, spans: Any) -> None:
    loop = build_loop(max_tool_calls=1)
    loop.budget_model.max_tool_calls = 0  # budget answers at once

    loop.run()

    run, tool, nested = guard_spans(spans)
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
    # Directly under the planner's hop span: lean, its chain its parent hop's and its own.
    assert chain_of(tool, spans) == (("planner", "ask_budget"), ("", ""))
    assert run.name == "invoke_agent planner"
    assert run.attributes is not None
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["gen_ai.agent.name"] == "planner"
    assert nested.name == "invoke_agent budget"
    assert nested.attributes is not None
    assert nested.attributes["otel_guard.chain.depth"] == 3
    roots = {s.attributes["otel_guard.chain.root"] for s in (run, tool, nested) if s.attributes}
    assert len(roots) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", str(roots.pop()))
    # planner's run -> the ask_budget call -> budget's run, parent to child, one trace.
    assert tool.parent is not None
    assert tool.parent.span_id == run.context.span_id
    assert nested.parent is not None
    assert nested.parent.span_id == tool.context.span_id
    assert {s.context.trace_id for s in (run, tool, nested)} == {run.context.trace_id}


# -- every entry point of a run is one hop --------------------------------------------------------


def test_kickoff_and_a_crew_task_are_one_hop_each(instrumented: Any, spans: Any) -> None:
    solo, _ = searcher(ScriptedLLM(model="scripted", agent="searcher", max_tool_calls=0))
    assert str(solo.kickoff("find it").raw) == "searcher answers without tools"
    task = Task(description="find it", expected_output="what was found", agent=solo)
    Crew(agents=[solo], tasks=[task], verbose=False).kickoff()

    assert [chain_of(s, spans)[0] for s in guard_spans(spans) if s.attributes] == [("searcher",)] * 2


async def test_the_async_entry_points_are_one_hop_each(instrumented: Any, spans: Any) -> None:
    solo, _ = searcher(ScriptedLLM(model="scripted", agent="searcher", max_tool_calls=0))

    await solo.kickoff_async("a")
    await solo.akickoff("b")
    await solo.kickoff("c")  # type: ignore[misc]  # in an event loop kickoff hands over to kickoff_async
    await solo.aexecute_task(Task(description="d", expected_output="e", agent=solo))

    assert [s.name for s in guard_spans(spans)] == ["invoke_agent searcher"] * 4
    assert all(s.attributes and s.attributes["otel_guard.chain.depth"] == 1 for s in guard_spans(spans))


def test_a_task_crewai_retries_after_an_error_is_the_same_hop(instrumented: Any, spans: Any) -> None:
    class FailsOnce(ScriptedLLM):
        def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.requests:
                self.requests.append([])
                raise RuntimeError("the model is busy")
            return super().call(messages, *args, **kwargs)

    solo, _ = searcher(FailsOnce(model="scripted", agent="searcher", max_tool_calls=0))
    task = Task(description="find it", expected_output="what was found", agent=solo)

    # Agent.execute_task catches the error and runs execute_task again, from inside itself.
    assert str(solo.execute_task(task)) == "searcher answers without tools"

    assert decisions(spans) == [("invoke_agent searcher", "allow", ("searcher",))]


# -- tool calls -----------------------------------------------------------------------------------


def test_a_tool_body_runs_inside_its_hop(instrumented: Any, spans: Any) -> None:
    solo, lookup = searcher()

    solo.kickoff("find it")

    assert lookup.chains == [("searcher", "lookup")]
    assert decisions(spans) == [
        ("invoke_agent searcher", "allow", ("searcher",)),
        ("execute_tool lookup", "allow", ("searcher", "lookup")),
    ]


class ContextLookup(Lookup):
    """Notes the names of the context variables its body runs with."""

    variables: list[set[str]] = Field(default_factory=list)

    def _run(self, question: str, **kwargs: Any) -> str:
        self.variables.append({variable.name for variable in contextvars.copy_context()})
        return super()._run(question, **kwargs)


def test_the_guard_adds_no_context_variable_of_its_own(instrumented: Any, spans: Any) -> None:
    # CrewAI's contexts hold 13 variables where a run starts; past 16 CPython's context is an array
    # node that every ContextVar.set CrewAI makes copies: the guard keeps its records in the
    # OpenTelemetry context, beside the hop's span and chain.
    lookup = ContextLookup()
    model = ScriptedLLM(model="scripted", agent="searcher", tool="lookup", max_tool_calls=1)
    agent("searcher", model, [lookup]).kickoff("find it")

    (names,) = lookup.variables
    assert {name for name in names if name.startswith("otel_guard")} == set()
    assert lookup.chains == [("searcher", "lookup")]


def tool_hook_events(run: Any) -> list[tuple[str, str, int]]:
    """(point, outcome, hook count) of the ``HookDispatchedEvent`` s of tool calls that ``run()`` emits."""
    from crewai.events.event_bus import crewai_event_bus
    from crewai.events.types.hook_events import HookDispatchedEvent

    seen: list[tuple[str, str, int]] = []
    with crewai_event_bus.scoped_handlers():

        @crewai_event_bus.on(HookDispatchedEvent)
        def note(source: Any, event: HookDispatchedEvent) -> None:
            seen.append((event.interception_point, event.outcome, event.hook_count))

        run()
        crewai_event_bus.flush()
    return [event for event in seen if event[0].endswith("tool_call")]


def test_a_tool_call_with_only_the_guard_s_hooks_emits_no_hook_event(instrumented: Any, spans: Any) -> None:
    # Unguarded, CrewAI emits none (no hook at the point); the guard's hooks let the call through.
    solo, lookup = searcher()
    assert tool_hook_events(lambda: solo.kickoff("find it")) == []
    assert lookup.chains == [("searcher", "lookup")]


def test_a_tool_call_with_a_hook_of_the_app_s_emits_crewai_s_events(instrumented: Any, spans: Any) -> None:
    from crewai.hooks import register_before_tool_call_hook, unregister_before_tool_call_hook

    def app_hook(context: Any) -> None:
        return None

    register_before_tool_call_hook(app_hook)
    try:
        solo, _ = searcher()
        events = tool_hook_events(lambda: solo.kickoff("find it"))
    finally:
        unregister_before_tool_call_hook(app_hook)
    assert events == [("pre_tool_call", "proceeded", 2)]  # the post point has the guard's hook alone


def test_a_refused_tool_call_emits_crewai_s_events(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(max_depth=1)  # the run is the root hop; its tool call would be a second
    solo, lookup = searcher()
    events = tool_hook_events(lambda: solo.kickoff("find it"))

    assert events == [("pre_tool_call", "aborted", 1), ("post_tool_call", "modified", 1)]
    assert lookup.chains == []


class TwoLookups(ScriptedLLM):
    """Asks for two lookups in one response: CrewAI runs them in parallel threads."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests.append(list(messages))
        if messages[-1].get("role") == "tool":
            return "both looked up"
        return [
            {
                "id": f"call_{key}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"question": key})},
            }
            for key in ("a", "b")
        ]


def test_parallel_tool_calls_are_siblings_not_a_cycle(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    solo, lookup = searcher(TwoLookups(model="scripted", agent="searcher"))

    assert str(solo.kickoff("find both").raw) == "both looked up"

    assert sorted(lookup.chains) == [("searcher", "lookup")] * 2
    lookups = [s for s in guard_spans(spans) if s.name == "execute_tool lookup"]
    assert [chain_of(s, spans)[0] for s in lookups if s.attributes] == [("searcher", "lookup")] * 2
    assert {s.attributes["otel_guard.decision"] for s in lookups if s.attributes} == {"allow"}
    (run,) = [s for s in guard_spans(spans) if s.name == "invoke_agent searcher"]
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in lookups)


def test_a_refused_run_outside_any_tool_raises_before_the_model_is_called(instrumented: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    model = ScriptedLLM(model="scripted", agent="planner", max_tool_calls=0)
    planner = agent("planner", model, [])

    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused) as refused:
        planner.kickoff("again")

    assert refused.value.reason == "cycle"
    assert model.requests == []


def test_a_crew_whose_task_is_refused_raises_it(instrumented: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    model = ScriptedLLM(model="scripted", agent="planner", max_tool_calls=0)
    planner = agent("planner", model, [])
    crew = Crew(agents=[planner], tasks=[Task(description="plan", expected_output="a plan", agent=planner)])

    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused):
        crew.kickoff()

    assert model.requests == []


# -- suppression and uninstrument -----------------------------------------------------------------


def test_suppressed_instrumentation_makes_no_hop(instrumented: Any, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(max_tool_calls=2)

    with suppress_instrumentation():
        loop.run()

    # Unguarded: the loop bounced until the scripted models stopped it.
    assert (loop.planner_model.runs, loop.budget_model.runs) == (3, 2)
    assert guard_spans(spans) == []


def patched(target: tuple[str, str]) -> Any:
    """What a patch target's owner holds under its name (a class's own attribute, not bound)."""
    module, name = target
    owner, _, attribute = name.rpartition(".")
    holder = importlib.import_module(module)
    return vars(getattr(holder, owner) if owner else holder)[attribute]


def test_uninstrument_restores_crewai(spans: Any) -> None:
    from crewai.hooks.dispatch import InterceptionPoint, get_hooks

    from otel_guard.instrumentation.crewai import PATCH_TARGETS, CrewAIInstrumentor

    points = (
        InterceptionPoint.PRE_TOOL_CALL,
        InterceptionPoint.POST_TOOL_CALL,
        InterceptionPoint.PRE_MODEL_CALL,
        InterceptionPoint.POST_MODEL_CALL,
    )
    before = {point: get_hooks(point) for point in points}
    otel_guard.configure(max_model_requests=100)  # so that the model-call hooks are registered too
    instrumentor = CrewAIInstrumentor()
    instrumentor.instrument()
    assert all(isinstance(patched(target), wrapt.FunctionWrapper) for target in PATCH_TARGETS)
    assert all(len(get_hooks(point)) > len(before[point]) for point in points)
    # An executor built while instrumented copies the model-call hooks: they must go quiet with it.
    warm = build_loop(max_tool_calls=0)
    warm.planner.execute_task(Task(description="warm up", expected_output="x", agent=warm.planner))
    instrumentor.uninstrument()

    assert not any(isinstance(patched(target), wrapt.ObjectProxy) for target in PATCH_TARGETS)
    assert {point: get_hooks(point) for point in points} == before
    spans.clear()
    otel_guard.configure(cycle_rule="agent", max_model_requests=1)
    loop = build_loop(max_tool_calls=2)
    with otel_guard.delegate("coordinator"):  # a tree whose one model request is soon spent
        loop.run()
        warm.planner_model.max_tool_calls = 1
        warm.planner.execute_task(Task(description="plan", expected_output="x", agent=warm.planner))

    # The loop ran unguarded, bounded only by the scripted models; the copied hooks counted nothing.
    assert (loop.planner_model.runs, loop.budget_model.runs) == (3, 2)
    assert len(warm.planner_model.requests) == 3  # the warm-up, then a tool call and the answer after it
    assert [s.name for s in guard_spans(spans)] == ["invoke_agent coordinator"]


def test_the_model_call_hooks_are_registered_only_once_a_setting_needs_them(instrumented: Any) -> None:
    from crewai.hooks.dispatch import InterceptionPoint, get_hooks

    def ours(point: InterceptionPoint) -> list[str]:
        return [hook.__name__ for hook in get_hooks(point) if hook.__name__.startswith("otel_guard")]

    solo, _ = searcher(ScriptedLLM(model="scripted", agent="searcher", max_tool_calls=0))
    solo.kickoff("a")
    # CrewAI builds a context and emits an event for every model call that has hooks: none of ours.
    assert ours(InterceptionPoint.PRE_MODEL_CALL) == ours(InterceptionPoint.POST_MODEL_CALL) == []
    assert ours(InterceptionPoint.PRE_TOOL_CALL) == ["otel_guard_before_tool_call"]

    otel_guard.configure(max_tokens=10**6)
    solo.kickoff("b")

    assert ours(InterceptionPoint.PRE_MODEL_CALL) == [
        "otel_guard_add_guidance",
        "otel_guard_before_model_call",
    ]
    assert ours(InterceptionPoint.POST_MODEL_CALL) == ["otel_guard_after_model_call"]


def test_kickoff_inside_a_running_event_loop_is_still_one_hop(instrumented: Any, spans: Any) -> None:
    solo, _ = searcher(ScriptedLLM(model="scripted", agent="searcher", max_tool_calls=0))

    async def in_a_loop() -> Any:
        return await solo.kickoff("x")  # type: ignore[misc]

    asyncio.run(in_a_loop())

    assert decisions(spans) == [("invoke_agent searcher", "allow", ("searcher",))]
