"""smolagents under otel-guard: runs, tool calls and managed-agent calls are hops, and a refusal
reaches the model with its text.

The agents are real smolagents agents on scripted models (a subclass of ``smolagents.Model``, see
``smolagents_loop.py``); spans and metrics go to the session's in-memory SDK (tests/conftest.py).
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from opentelemetry.instrumentation.utils import suppress_instrumentation
from smolagents import ActionStep, FinalAnswerStep
from smolagents.utils import AgentToolExecutionError
from smolagents_loop import Ask, CallBudget, ScriptedModel, agent, build_loop, managed_loop

import otel_guard
from otel_guard.instrumentation.smolagents import SmolagentsInstrumentor
from tests.hop_spans import assert_observe_mode_recorded_the_loop, decisions, guard_spans, refused

instrumented = instrumentor_fixture(SmolagentsInstrumentor)

PLANNER_PATH = "planner → ask_budget → budget → ask_planner"
REFUSED = "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:"
SMOLAGENTS_RETRY = "Please try again"  # what smolagents' own wrapping of a tool's error tells the model


def chain_of() -> tuple[str, ...]:
    chain = otel_guard.current_chain()
    return tuple(hop.agent for hop in chain.hops) if chain else ()


# -- the loop through tools ---------------------------------------------------------------------


def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    output = loop.planner().run("Plan the team offsite")

    # Budget's call back into planner ran its tool, whose planner run was refused: planner ran
    # once, budget once, two tool calls in all, and both answered.
    assert (loop.planner_model.runs, loop.budget_model.runs, loop.calls.made) == (1, 1, 2)
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert str(output).startswith("planner answers after Observation:\nbudget answers after Error:\nRefused")

    # The budget model got the refusal as the step's tool error: reason, path, do not retry, and
    # none of smolagents' "Please try again".
    (text,) = loop.budget_model.tool_responses
    assert text.startswith(f"Error:\n{REFUSED}")
    assert f"agent planner is already in chain {PLANNER_PATH}." in text
    assert "do not call it again" in text
    assert SMOLAGENTS_RETRY not in text

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal.events] == ["otel_guard.refused"]
    # One trace: each hop under the one that led to it.
    assert len({span.context.trace_id for span in guard_spans(spans)}) == 1


def test_the_agent_rule_stops_the_loop_at_the_same_bounce(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    loop.planner().run("Plan the team offsite")

    assert loop.calls.made == 2
    assert decisions(spans)[-1][:2] == ("invoke_agent planner", "refuse")


def test_a_refused_step_keeps_the_refusal_as_its_error(instrumented: SmolagentsInstrumentor) -> None:
    loop = build_loop()
    budgets: list[Any] = []
    make_budget = loop.budget
    loop.budget = lambda: budgets.append(make_budget()) or budgets[-1]  # type: ignore[method-assign]

    loop.planner().run("Plan the team offsite")

    (budget,) = budgets
    failed = [step for step in budget.memory.steps if isinstance(step, ActionStep) and step.error]
    (step,) = failed
    assert isinstance(step.error, AgentToolExecutionError)
    assert str(step.error).startswith(REFUSED)
    assert isinstance(step.error.__cause__, otel_guard.DelegationRefused)
    assert step.error.dict()["type"] == "AgentToolExecutionError"


def test_a_tool_named_like_its_agent_is_one_hop_and_is_refused_before_its_body(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    output = loop.planner().run("Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    # The refused tool's body never ran; the model got the refusal and both runs answered.
    assert loop.tool_bodies == {"budget": 1}
    (text,) = loop.budget_model.tool_responses
    assert "agent planner is already in chain planner → budget." in text
    assert SMOLAGENTS_RETRY not in text
    assert str(output).startswith("planner answers after")


# -- managed agents -----------------------------------------------------------------------------


@pytest.mark.parametrize("code", [False, True], ids=["ToolCallingAgent", "CodeAgent"])
def test_a_managed_agent_call_is_one_hop_into_the_agent(
    instrumented: SmolagentsInstrumentor, spans: Any, code: bool
) -> None:
    loop = managed_loop(code=code)

    output = loop.planner.run("Plan the team offsite")

    # planner manages budget, which manages a second planner: that call is the first bounce.
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert loop.calls.made == 2
    first_planner, first_budget, second_planner = loop.models[:3]
    assert second_planner.requests == []  # the refused run never reached its model
    (text,) = first_budget.tool_responses
    assert f"Error:\n{REFUSED} agent planner is already in chain planner → budget." in text
    assert "do not call it again" in text
    assert SMOLAGENTS_RETRY not in text
    assert "request to another team member" not in text
    (answer,) = first_planner.tool_responses
    assert "budget answers after" in answer
    assert "planner answers after" in str(output)


def test_a_code_agents_code_calls_its_tools_inside_the_run(instrumented: SmolagentsInstrumentor) -> None:
    # The local executor runs the code in a thread of its own: the chain goes along.
    seen: list[tuple[str, ...]] = []
    lookup = Ask("lookup", "Look something up.", lambda question: seen.append(chain_of()) or "found")
    model = ScriptedModel("searcher", "lookup", CallBudget(1), code=True)

    output = agent("searcher", model, [lookup], code=True).run("find")

    assert seen == [("searcher", "lookup")]
    assert str(output).startswith("searcher answers after")


# -- what is a hop ------------------------------------------------------------------------------


def test_parallel_tool_calls_are_siblings_not_a_cycle(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[tuple[str, ...]] = []
    lookup = Ask("lookup", "Look something up.", lambda question: seen.append(chain_of()) or "found")
    model = ScriptedModel("searcher", "lookup", CallBudget(3), parallel=3)

    agent("searcher", model, [lookup]).run("find")

    assert seen == [("searcher", "lookup")] * 3
    assert [d for d in decisions(spans) if d[0] == "execute_tool lookup"] == [
        ("execute_tool lookup", "allow", ("searcher", "lookup"))
    ] * 3


def test_the_final_answer_is_no_hop(instrumented: SmolagentsInstrumentor, spans: Any) -> None:
    model = ScriptedModel("searcher", None, CallBudget(0))

    agent("searcher", model).run("answer at once")

    assert decisions(spans) == [("invoke_agent searcher", "allow", ("searcher",))]


def test_a_direct_tool_call_is_a_hop(instrumented: SmolagentsInstrumentor, spans: Any) -> None:
    seen: list[tuple[str, ...]] = []
    lookup = Ask("lookup", "Look something up.", lambda question: seen.append(chain_of()) or "found")

    assert lookup(question="q") == "found"

    assert seen == [("lookup",)]
    assert decisions(spans) == [("execute_tool lookup", "allow", ("lookup",))]


def test_an_agent_without_a_name_is_its_class(instrumented: SmolagentsInstrumentor, spans: Any) -> None:
    from smolagents import ToolCallingAgent

    model = ScriptedModel("anonymous", None, CallBudget(0))
    ToolCallingAgent(tools=[], model=model, verbosity_level=-1).run("hello")

    assert decisions(spans) == [("invoke_agent ToolCallingAgent", "allow", ("ToolCallingAgent",))]


def test_a_refused_run_outside_any_tool_raises_before_the_task_enters_memory(
    instrumented: SmolagentsInstrumentor,
) -> None:
    model = ScriptedModel("planner", None, CallBudget(0))
    planner = agent("planner", model)

    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused) as raised:
        planner.run("again")

    assert raised.value.reason == "cycle"
    assert model.requests == []
    assert planner.memory.steps == []


# -- streamed runs ------------------------------------------------------------------------------


def test_a_streamed_run_is_one_hop_open_until_its_last_step(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    seen: list[tuple[str, ...]] = []
    lookup = Ask("lookup", "Look something up.", lambda question: seen.append(chain_of()) or "found")
    model = ScriptedModel("searcher", "lookup", CallBudget(1))

    steps = agent("searcher", model, [lookup]).run("find", stream=True)
    first = next(steps)
    assert guard_spans(spans) == []  # the run's hop is open
    assert chain_of() == ()  # and its context is not left attached between steps
    rest = list(steps)

    assert isinstance([first, *rest][-1], FinalAnswerStep)
    assert seen == [("searcher", "lookup")]
    assert decisions(spans) == [
        ("invoke_agent searcher", "allow", ("searcher",)),
        ("execute_tool lookup", "allow", ("searcher", "lookup")),
    ]


def until_a_step_ends(steps: Any) -> None:
    """Iterate ``steps`` to the end of its first step: where smolagents' own stream can be closed
    (closed inside a step, it yields again from a ``finally`` and raises "generator ignored
    GeneratorExit", guarded or not)."""
    for step in steps:
        if isinstance(step, ActionStep):
            return


def test_a_streamed_run_closed_early_ends_its_hop(instrumented: SmolagentsInstrumentor, spans: Any) -> None:
    model = ScriptedModel("searcher", None, CallBudget(0))

    steps = agent("searcher", model).run("find", stream=True)
    until_a_step_ends(steps)
    steps.close()  # type: ignore[attr-defined]
    assert decisions(spans) == [("invoke_agent searcher", "allow", ("searcher",))]

    dropped = agent("searcher", model).run("find", stream=True)
    until_a_step_ends(dropped)
    del dropped
    gc.collect()
    assert len(guard_spans(spans)) == 2

    # Closed inside a step, smolagents' stream fails to close as it does unguarded; the hop ends.
    inside = agent("searcher", model).run("find", stream=True)
    next(inside)
    with pytest.raises(RuntimeError, match="generator ignored GeneratorExit"):
        inside.close()  # type: ignore[attr-defined]
    assert len(guard_spans(spans)) == 3


# -- a refusal the tool handled -----------------------------------------------------------------


def test_a_tool_that_caught_a_refusal_and_failed_otherwise_keeps_its_own_error(
    instrumented: SmolagentsInstrumentor,
) -> None:
    def ask(question: str) -> str:
        try:
            with otel_guard.delegate("searcher"):
                return "unreachable"
        except otel_guard.DelegationRefused:
            raise RuntimeError("the lookup service is down") from None

    lookup = Ask("lookup", "Look something up.", ask)
    model = ScriptedModel("searcher", "lookup", CallBudget(1))

    agent("searcher", model, [lookup]).run("find")

    (text,) = model.tool_responses
    assert "the lookup service is down" in text
    assert "Refused by otel-guard" not in text


# -- observe mode, suppression, uninstrument ----------------------------------------------------


def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: SmolagentsInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe", max_depth=32, max_name_depth=32)
    loop = build_loop()

    loop.planner().run("Plan the team offsite")

    assert loop.calls.made == 6  # let through: the scripted models bounded the loop
    assert all(text.startswith("Observation:") for text in loop.budget_model.tool_responses)
    assert_observe_mode_recorded_the_loop(spans, metric_reader)


def test_suppressed_instrumentation_makes_no_hop(instrumented: SmolagentsInstrumentor, spans: Any) -> None:
    loop = managed_loop(code=True)  # the CodeAgent's code thread sees the suppression too

    with suppress_instrumentation():
        loop.planner.run("Plan the team offsite")

    assert loop.calls.made == 6
    assert guard_spans(spans) == []


def test_uninstrument_restores_smolagents(spans: Any) -> None:
    import wrapt
    from smolagents import MultiStepAgent, Tool, local_python_executor

    def ask(question: str) -> str:
        with otel_guard.delegate("lookup"), otel_guard.delegate("lookup"):  # refused: a cycle
            return "unreachable"

    model = ScriptedModel("searcher", "lookup", CallBudget(2))
    searcher = agent("searcher", model, [Ask("lookup", "Look something up.", ask)])
    instrumentor = SmolagentsInstrumentor()
    instrumentor.instrument()
    assert isinstance(MultiStepAgent.__dict__["run"], wrapt.FunctionWrapper)
    searcher.run("find")  # the agent now has the guard's step callback
    assert model.tool_responses[-1].startswith("Error:\nRefused by otel-guard")
    instrumentor.uninstrument()
    spans.clear()

    assert not isinstance(MultiStepAgent.__dict__["run"], wrapt.ObjectProxy)
    assert not isinstance(Tool.__dict__["__call__"], wrapt.ObjectProxy)
    assert not isinstance(vars(local_python_executor)["timeout"], wrapt.ObjectProxy)
    # The step callback the agent keeps does nothing now: smolagents' own text reaches the model.
    searcher.run("find")
    assert SMOLAGENTS_RETRY in model.tool_responses[-1]
    # The loop runs unguarded, bounded only by the scripted models.
    loop = build_loop()
    loop.planner().run("Plan the team offsite")
    assert loop.calls.made == 6
    assert [span for span in guard_spans(spans) if span.name != "invoke_agent lookup"] == []
