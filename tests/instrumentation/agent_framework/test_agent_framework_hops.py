"""Microsoft Agent Framework under otel-guard: runs and tool calls are hops, and a refusal reaches the model.

The agents are real Agent Framework agents on scripted chat clients (``BaseChatClient`` under Agent
Framework's own layers, see ``agent_framework_loop.py``); spans and metrics go to the session's
in-memory SDK (tests/conftest.py), where Agent Framework's own spans land too.
"""

from __future__ import annotations

import asyncio
import gc
import re
from typing import Any

import pytest
import wrapt
from agent_framework import (
    Agent,
    AgentContext,
    AgentMiddleware,
    AgentResponse,
    BaseChatClient,
    ChatResponse,
    FunctionInvocationContext,
    FunctionMiddleware,
    Message,
    MiddlewareTermination,
    WorkflowBuilder,
    tool,
)
from agent_framework_loop import CallBudget, ScriptedClient, build_loop
from agent_framework_support import decisions, framework_spans, guard_spans, instrumented_fixture, parent_of
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor
from otel_guard.instrumentation.agent_framework._runs import RUNS
from tests.conventions import assert_follows
from tests.hop_spans import assert_observe_mode_recorded_the_loop, refused

instrumented = instrumented_fixture()

PLANNER_PATH = "planner → ask_budget → budget → ask_planner"


# -- the loop -----------------------------------------------------------------------------------


async def test_the_loop_is_stopped_at_the_first_bounce_and_the_model_answers(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    result = await loop.planner.run("Plan the team offsite")

    # Budget's call back into planner ran its tool, whose planner run was refused: planner ran
    # once, budget once, two tool calls in all, and both answered.
    assert (loop.planner_client.runs, loop.budget_client.runs, loop.calls.made) == (1, 1, 2)
    assert loop.tool_bodies == {"ask_budget": 1, "ask_planner": 1}
    assert result.text.startswith("planner answers after budget answers after Refused by otel-guard")

    # The budget model got the refusal's own text as the tool's result, not Agent Framework's
    # "Error: Function failed.": reason, path, do not retry.
    (refusal,) = loop.budget_client.tool_results
    text = str(refusal.result)
    assert text.startswith("Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:")
    assert f"agent planner is already in chain {PLANNER_PATH}" in text
    assert "do not call it again" in text
    assert "Function failed" not in text

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool ask_budget", "allow", ("planner", "ask_budget")),
        ("invoke_agent budget", "allow", ("planner", "ask_budget", "budget")),
        ("execute_tool ask_planner", "allow", ("planner", "ask_budget", "budget", "ask_planner")),
        ("invoke_agent planner", "refuse", ("planner", "ask_budget", "budget", "ask_planner", "planner")),
    ]
    (refusal_span,) = refused(spans)
    assert refusal_span.attributes["otel_guard.reason"] == "cycle"
    assert [e.name for e in refusal_span.events] == ["otel_guard.refused"]


async def test_the_default_rule_and_the_agent_rule_stop_the_loop_at_the_same_bounce(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop()

    await loop.planner.run("Plan the team offsite")

    assert loop.calls.made == 2
    assert decisions(spans)[-1][:2] == ("invoke_agent planner", "refuse")


async def test_a_tool_named_like_its_agent_is_one_hop_and_is_refused_before_its_body(
    instrumented: AgentFrameworkInstrumentor, spans: Any
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
    (refusal,) = loop.budget_client.tool_results
    assert "agent planner is already in chain planner → budget." in str(refusal.result)
    assert result.text.startswith("planner answers after budget answers after Refused by otel-guard")


def agents_as_tools(calls: CallBudget) -> tuple[Agent[Any], ScriptedClient]:
    """Planner and budget, each the other's tool through Agent Framework's ``as_tool()``, under a
    tool name of its own; the planner agent and the budget agent's client."""
    planner_client = ScriptedClient("planner", "ask_budget", calls, tool_input={"task": "price it"})
    budget_client = ScriptedClient("budget", "ask_planner", calls, tool_input={"task": "plan it"})
    planner = Agent(client=planner_client, name="planner")
    budget = Agent(client=budget_client, name="budget", tools=[planner.as_tool(name="ask_planner")])
    planner.default_options["tools"].append(budget.as_tool(name="ask_budget"))
    return planner, budget_client


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_an_agent_offered_as_a_tool_is_one_hop_into_that_agent(
    instrumented: AgentFrameworkInstrumentor, spans: Any, streamed: bool
) -> None:
    # as_tool() runs its agent streamed, inside the tool call: the call is one hop into the agent,
    # and the agent's run joins it, whether the outer run is streamed or not.
    otel_guard.configure(cycle_rule="agent")
    calls = CallBudget(6)
    planner, budget_client = agents_as_tools(calls)

    if streamed:
        stream = planner.run("Plan the team offsite", stream=True)
        async for _update in stream:
            pass
        result = await stream.get_final_response()
    else:
        result = await planner.run("Plan the team offsite")

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert calls.made == 2
    (refusal,) = budget_client.tool_results
    assert "agent planner is already in chain planner → budget." in str(refusal.result)
    assert result.text.startswith("planner answers after budget answers after Refused by otel-guard")
    # The call's hop span sits under the calling run's span, and Agent Framework's span of the tool
    # call (and the agent's run inside it) under the hop's.
    hop = next(s for s in guard_spans(spans) if s.name == "invoke_agent budget")
    (tool_span,) = [s for s in framework_spans(spans) if s.name == "execute_tool ask_budget"]
    assert parent_of(tool_span, spans) is hop
    (budget_run,) = [s for s in framework_spans(spans) if s.name == "invoke_agent budget"]
    assert parent_of(budget_run, spans) is tool_span


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumented: AgentFrameworkInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe", max_depth=32, max_name_depth=32)
    loop = build_loop()

    result = await loop.planner.run("Plan the team offsite")

    # Nothing refused: the scripted models bounded the bouncing (six tool calls in all).
    assert loop.calls.made == 6
    assert (loop.planner_client.runs, loop.budget_client.runs) == (4, 3)
    assert not any("Refused" in str(r.result) for r in loop.budget_client.tool_results)
    assert result.text.startswith("planner answers after budget answers")

    assert_observe_mode_recorded_the_loop(spans, metric_reader)


# -- spans --------------------------------------------------------------------------------------


async def test_spans_carry_the_contract_attributes_and_hold_agent_frameworks_own(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=1)

    await loop.planner.run("Plan the team offsite")

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

    # Each hop span is the parent of Agent Framework's own span of the same call (the guard's
    # middleware runs around it), with no guard attributes on Agent Framework's; all in one trace.
    for hop in by_name.values():
        (theirs,) = [s for s in framework_spans(spans) if s.name == hop.name and parent_of(s, spans) is hop]
        assert not any(key.startswith("otel_guard.") for key in theirs.attributes or {})
    # What the tool runs (budget's run) is inside the tool's hop.
    (budget_hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent budget"]
    assert parent_of(budget_hop, spans).name == "execute_tool ask_budget"  # type: ignore[union-attr]
    assert parent_of(parent_of(budget_hop, spans), spans) is tool_hop  # type: ignore[arg-type]
    assert len({s.context.trace_id for s in spans.all()}) == 1


async def test_a_refused_tool_call_is_never_run_and_has_no_span_of_agent_frameworks(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    loop = build_loop(planner_tool="budget", budget_tool="planner")

    await loop.planner.run("Plan the team offsite")

    (refusal,) = refused(spans)
    assert refusal.name == "execute_tool planner"
    assert refusal.status.status_code == StatusCode.ERROR
    # Agent Framework's span of a tool call starts when the tool is invoked: a refused one never is.
    assert [s.name for s in framework_spans(spans) if s.name == "execute_tool planner"] == []


# -- runs and tools -----------------------------------------------------------------------------


def answering_agent(name: str) -> tuple[Agent[Any], ScriptedClient]:
    client = ScriptedClient(name, None, CallBudget(0))
    return Agent(client=client, name=name), client


async def test_a_run_and_a_streamed_run_are_one_hop_each(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    solo, client = answering_agent("solo")

    await solo.run("a")
    async for _update in solo.run("b", stream=True):
        pass

    assert client.runs == 2
    assert [s.attributes["otel_guard.chain.agents"] for s in guard_spans(spans)] == [("solo",)] * 2


async def test_a_run_in_a_service_session_carries_its_id_and_follows_the_conventions(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    from agent_framework import AgentSession

    solo, _client = answering_agent("solo")

    await solo.run("a", session=AgentSession(service_session_id="conv-42"))

    (hop,) = guard_spans(spans)
    assert hop.attributes is not None
    assert hop.attributes["gen_ai.conversation.id"] == "conv-42"
    assert_follows(hop, available={"gen_ai.agent.name", "gen_ai.conversation.id"})
    own = [s for s in framework_spans(spans) if s.name == "invoke_agent solo"]
    assert [dict(s.attributes or {}).get("gen_ai.conversation.id") for s in own] == ["conv-42"]


async def test_the_tool_calls_of_a_streamed_run_extend_its_chain(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # A streamed run happens while its stream is read, after the run's middleware has returned: the
    # run's chain is put back in the context of each read, so its tool calls extend it.
    seen: list[tuple[str, ...]] = []
    agent = lookup_agent(seen)

    with otel_guard.delegate("caller"):
        async for _update in agent.run("find", stream=True):
            pass

    assert seen == [("caller", "searcher", "lookup")]
    assert decisions(spans) == [
        ("invoke_agent caller", "allow", ("caller",)),
        ("invoke_agent searcher", "allow", ("caller", "searcher")),
        ("execute_tool lookup", "allow", ("caller", "searcher", "lookup")),
    ]
    # The run's hop ends with its stream, after the tool call's.
    run_hop, tool_hop = guard_spans(spans)[1:]
    assert (run_hop.end_time or 0) >= (tool_hop.end_time or 0) > 0


async def test_a_run_whose_stream_is_abandoned_still_ends_its_hop(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    solo, _client = answering_agent("solo")

    async def first_update() -> None:
        # A caller that stops reading after one update and never closes the stream.
        async for _update in solo.run("a", stream=True):
            break

    await asyncio.create_task(first_update())
    gc.collect()

    assert [s.name for s in guard_spans(spans)] == ["invoke_agent solo"]


def lookup_agent(seen: list[tuple[str, ...]], parallel: int = 1) -> Agent[Any]:
    @tool
    def lookup(question: str) -> str:
        """Look something up."""
        chain = otel_guard.current_chain()
        seen.append(tuple(hop.agent for hop in chain.hops) if chain is not None else ())
        return question.upper()

    client = ScriptedClient("searcher", "lookup", CallBudget(parallel), parallel=parallel)
    return Agent(client=client, name="searcher", tools=[lookup])


async def test_a_sync_tool_runs_inside_its_hop(instrumented: AgentFrameworkInstrumentor) -> None:
    # Agent Framework runs a sync tool in a worker thread: the chain follows the call there.
    seen: list[tuple[str, ...]] = []

    await lookup_agent(seen).run("find")

    assert seen == [("searcher", "lookup")]


async def test_parallel_tool_calls_are_siblings_not_a_cycle(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    seen: list[tuple[str, ...]] = []

    result = await lookup_agent(seen, parallel=2).run("find")

    assert seen == [("searcher", "lookup")] * 2
    lookups = [s for s in guard_spans(spans) if s.name == "execute_tool lookup"]
    assert [s.attributes["otel_guard.decision"] for s in lookups] == ["allow", "allow"]
    assert result.text == "searcher answers after FROM SEARCHER; FROM SEARCHER"


async def test_a_failing_tool_fails_its_hop_and_the_model_gets_agent_frameworks_error(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    @tool
    def lookup(question: str) -> str:
        """Look something up."""
        raise RuntimeError("the index is down")

    client = ScriptedClient("searcher", "lookup", CallBudget(1))
    result = await Agent(client=client, name="searcher", tools=[lookup]).run("find")

    # Not a refusal: Agent Framework's own error result, as without the guard.
    (failed,) = client.tool_results
    assert str(failed.result) == "Error: Function failed."
    assert result.text == "searcher answers after Error: Function failed."
    hop = next(s for s in guard_spans(spans) if s.name == "execute_tool lookup")
    assert hop.status.status_code == StatusCode.ERROR
    assert hop.attributes["error.type"] == "RuntimeError"


async def test_a_call_other_middleware_answers_is_no_hop(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # The tool is invoked after the agent's own function middleware: a call it answers delegates nothing.
    class Cached(FunctionMiddleware):
        async def process(self, context: FunctionInvocationContext, call_next: Any) -> None:
            context.result = "cached"

    seen: list[tuple[str, ...]] = []
    agent = lookup_agent(seen)
    agent.middleware = [*(agent.middleware or ()), Cached()]

    result = await agent.run("find")

    assert result.text == "searcher answers after cached"
    assert seen == []
    assert [s.name for s in guard_spans(spans)] == ["invoke_agent searcher"]


async def test_a_run_another_middleware_ends_on_purpose_is_a_hop_that_did_not_fail(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # MiddlewareTermination is Agent Framework's way for middleware to end a run with its own result.
    class Canned(AgentMiddleware):
        async def process(self, context: AgentContext, call_next: Any) -> None:
            context.result = AgentResponse(messages=[Message(role="assistant", contents=["canned"])])
            raise MiddlewareTermination

    solo, client = answering_agent("solo")
    solo.middleware = [*(solo.middleware or ()), Canned()]

    result = await solo.run("a")

    assert result.text == "canned"
    assert client.requests == []
    (hop,) = guard_spans(spans)
    assert hop.name == "invoke_agent solo"
    assert hop.status.status_code == StatusCode.UNSET


class PassesOn(FunctionMiddleware):
    """Function middleware of the app's that only calls on."""

    async def process(self, context: FunctionInvocationContext, call_next: Any) -> None:
        await call_next()


async def finishing_run(middleware: list[Any] | None) -> ScriptedClient:
    """A run whose one tool raises MiddlewareTermination; its client, to count the model requests."""

    @tool
    def finish(question: str) -> str:
        """Stop here."""
        raise MiddlewareTermination("done")

    client = ScriptedClient("searcher", "finish", CallBudget(1))
    await Agent(client=client, name="searcher", tools=[finish], middleware=middleware).run("find")
    return client


@pytest.mark.parametrize("middleware", [None, "passes on"])
async def test_a_tool_that_ends_the_function_loop_is_a_hop_that_did_not_fail_and_the_run_goes_as_unguarded(
    instrumented: AgentFrameworkInstrumentor, spans: Any, middleware: str | None
) -> None:
    # Agent Framework ends the function loop on a tool's MiddlewareTermination only when the run has
    # function middleware; with none it calls the tool directly and hands the model an error result.
    # The guard adds no middleware, so either way the run goes as it would unguarded.
    stack = None if middleware is None else [PassesOn()]
    with suppress_instrumentation():
        unguarded = await finishing_run(stack)
    assert guard_spans(spans) == []

    guarded = await finishing_run(stack)

    hop = next(s for s in guard_spans(spans) if s.name == "execute_tool finish")
    assert hop.status.status_code == StatusCode.UNSET
    assert len(guarded.requests) == len(unguarded.requests) == (2 if middleware is None else 1)


async def test_a_tool_called_outside_a_guarded_run_is_no_hop(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # FunctionTool.invoke is guarded only within a guarded agent run: a direct call delegates nothing.
    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city}: sunny"

    result = await lookup.invoke(arguments={"city": "Lisbon"})

    assert [item.text for item in result] == ["Lisbon: sunny"]
    assert guard_spans(spans) == []


async def test_a_chat_client_without_agent_frameworks_layers_is_left_as_it_is(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # A bare BaseChatClient (no function-invocation or chat-middleware layer) would hand a
    # `middleware=` keyword on to its provider call: the guard gives it none, budgets on or not.
    class Bare(BaseChatClient[Any]):
        def _inner_get_response(self, *, messages: Any, stream: bool, options: Any) -> Any:
            async def response() -> ChatResponse[Any]:
                return ChatResponse(messages=[Message(role="assistant", contents=["bare answer"])])

            return response()

    otel_guard.configure(max_model_requests=5)

    result = await Agent(client=Bare(), name="bare").run("a")

    assert result.text == "bare answer"
    assert decisions(spans) == [("invoke_agent bare", "allow", ("bare",))]


async def test_a_refused_run_outside_any_tool_raises_before_the_model_is_called(
    instrumented: AgentFrameworkInstrumentor,
) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner, client = answering_agent("planner")

    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused) as raised:
        await planner.run("again")
    with otel_guard.delegate("planner"), pytest.raises(otel_guard.DelegationRefused):
        async for _update in planner.run("again", stream=True):
            pass

    assert raised.value.reason == "cycle"
    assert client.requests == []


async def test_an_agent_built_with_another_agents_middleware_carries_the_guard_once(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # A handoff workflow clones each participant with its middleware: the clone's run is one hop,
    # not the same agent twice (refused as a cycle of itself).
    planner, client = answering_agent("planner")
    clone = Agent(client=client, name="planner", middleware=planner.middleware)

    result = await clone.run("Plan the team offsite")

    assert result.text == "planner answers without tools"
    assert [item for item in clone.middleware if item is RUNS] == [RUNS]
    assert decisions(spans) == [("invoke_agent planner", "allow", ("planner",))]


async def test_each_agent_run_of_a_workflow_is_a_hop_from_the_workflows_context(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    # A workflow's executors run their agents: each run is a hop from where the workflow runs; the
    # workflow's edges are not hops (budget runs after planner, not inside it).
    planner, planner_client = answering_agent("planner")
    budget, budget_client = answering_agent("budget")
    workflow = WorkflowBuilder(start_executor=planner).add_edge(planner, budget).build()

    with otel_guard.delegate("coordinator"):
        result = await workflow.run("Plan the team offsite")

    assert [output.text for output in result.get_outputs()] == [
        "planner answers without tools",
        "budget answers without tools",
    ]
    assert (len(planner_client.requests), len(budget_client.requests)) == (1, 1)
    assert decisions(spans) == [
        ("invoke_agent coordinator", "allow", ("coordinator",)),
        ("invoke_agent planner", "allow", ("coordinator", "planner")),
        ("invoke_agent budget", "allow", ("coordinator", "budget")),
    ]


# -- suppression and uninstrument ---------------------------------------------------------------


async def test_suppressed_instrumentation_makes_no_hop(
    instrumented: AgentFrameworkInstrumentor, spans: Any
) -> None:
    loop = build_loop()

    with suppress_instrumentation():
        result = await loop.planner.run("Plan the team offsite")

    # Unguarded: the loop bounced until the scripted models stopped it.
    assert loop.calls.made == 6
    assert "Refused" not in result.text
    assert guard_spans(spans) == []


async def test_uninstrument_restores_agent_framework(spans: Any) -> None:
    from agent_framework import AgentMiddlewareLayer

    instrumentor = AgentFrameworkInstrumentor()
    instrumentor.instrument()
    assert isinstance(AgentMiddlewareLayer.__dict__["__init__"], wrapt.FunctionWrapper)
    seen: list[tuple[str, ...]] = []
    built_while_instrumented = lookup_agent(seen)
    assert built_while_instrumented.middleware == [RUNS]
    instrumentor.uninstrument()

    assert not isinstance(AgentMiddlewareLayer.__dict__["__init__"], wrapt.ObjectProxy)
    # An agent built while instrumented has the guard's middleware taken off again.
    assert built_while_instrumented.middleware == []
    await built_while_instrumented.run("find")
    assert seen == [()]  # no chain in force: the tool ran outside any hop
    # The loop, built now, runs unguarded, bounded only by the scripted models.
    loop = build_loop()
    await loop.planner.run("Plan the team offsite")
    assert loop.calls.made == 6
    assert loop.planner.middleware is None
    assert guard_spans(spans) == []
