"""OpenAI Agents SDK: runs and agents-as-tools are guarded hops; a refusal is the model's tool result.

Driven by the SDK's own offline test model (see openai_agents_models.py): no API key, no network.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from agents import Agent, Runner
from agents.run import AgentRunner
from openai_agents_helpers import REFUSAL, attrs, last_tool_output
from openai_agents_models import CallBudget, LoopModel, agents_as_tools_of_each_other
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_guard
from otel_guard import telemetry
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.openai_agents import (
    INTERNAL_NAMES,
    PATCH_TARGETS,
    OpenAIAgentsInstrumentor,
)
from tests.conventions import assert_follows
from tests.hop_spans import chain_of, guard_spans
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumentor = instrumentor_fixture(OpenAIAgentsInstrumentor)


async def test_agent_tool_loop_is_stopped_at_the_first_bounce(
    instrumentor: OpenAIAgentsInstrumentor, spans, metric_reader
) -> None:
    otel_guard.configure(cycle_rule="agent")
    budget = CallBudget(10)
    planner, budget_agent = agents_as_tools_of_each_other(budget)

    result = await Runner.run(planner, "Plan a trip to Lisbon.")

    # planner -> budget ran; budget -> planner was refused, and nothing more was tried.
    assert budget.made == 2
    # The refused hop's body (a nested planner run) never ran: planner's model only saw the user.
    assert planner.model.user_turns() == ["Plan a trip to Lisbon.", "Plan a trip to Lisbon."]
    # budget's model received the refusal as the tool's output, and answered with it.
    refusal = last_tool_output(budget_agent.model)
    assert refusal.startswith(REFUSAL)
    assert "do not call it again" in refusal
    assert result.final_output == f"planner answers: budget answers: {refusal}"

    planner_spans = spans.named("invoke_agent planner")
    assert sorted(attrs(s)["otel_guard.decision"] for s in planner_spans) == ["allow", "refuse"]
    run_span = next(s for s in planner_spans if attrs(s)["otel_guard.decision"] == "allow")
    refused = next(s for s in planner_spans if attrs(s)["otel_guard.decision"] == "refuse")
    budget_span = spans.one("invoke_agent budget")
    assert attrs(refused)["otel_guard.reason"] == "cycle"
    assert chain_of(refused, spans)[0] == ("planner", "budget", "planner")
    assert [e.name for e in refused.events] == ["otel_guard.refused"]
    # One hop per delegation, nested: planner run > budget (agent-as-tool) > refused planner.
    assert budget_span.parent.span_id == run_span.context.span_id
    assert refused.parent.span_id == budget_span.context.span_id
    assert not spans.named("execute_tool budget")
    assert not spans.named("execute_tool planner")

    refusals = [
        point.value
        for attributes, point in metric_reader.points("otel_guard.decisions")
        if attributes.get("otel_guard.decision") == "refuse"
        and attributes.get("gen_ai.agent.name") == "planner"
    ]
    assert refusals
    assert refusals[0] >= 1


async def test_streaming_agent_tools_join_their_tool_hop_too(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    """``as_tool(on_stream=...)`` runs the nested agent with ``run_streamed``: still one hop."""
    otel_guard.configure(cycle_rule="agent")
    budget = CallBudget(10)
    planner, budget_agent = agents_as_tools_of_each_other(budget)
    events: list[object] = []
    planner.tools = [budget_agent.as_tool("budget", "Ask budget.", on_stream=events.append)]
    budget_agent.tools = [planner.as_tool("planner", "Ask planner.", on_stream=events.append)]

    await Runner.run(planner, "Plan a trip to Lisbon.")

    assert budget.made == 2
    assert events  # the nested budget run did stream
    assert last_tool_output(budget_agent.model).startswith(REFUSAL)
    assert chain_of(spans.one("invoke_agent budget"), spans)[0] == (
        "planner",
        "budget",
    )


async def test_spans_carry_the_contract_attributes(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner, _ = agents_as_tools_of_each_other(CallBudget(10))

    await Runner.run(planner, "Plan a trip to Lisbon.")

    budget_span = attrs(spans.one("invoke_agent budget"))
    assert budget_span["gen_ai.operation.name"] == "invoke_agent"
    assert budget_span["gen_ai.agent.name"] == "budget"
    # Its chain: its lists, or (a hop nested in the previous hop's span) its parent hop's and its own.
    assert chain_of(spans.one("invoke_agent budget"), spans) == (("planner", "budget"), ("", ""))
    assert budget_span["otel_guard.chain.depth"] == 2
    assert budget_span["otel_guard.name_depth"] == 1
    assert budget_span["otel_guard.decision"] == "allow"
    assert budget_span["otel_guard.mode"] == "enforce"
    assert "otel_guard.reason" not in budget_span
    roots = {attrs(s)["otel_guard.chain.root"] for s in spans.all()}
    assert len(roots) == 1
    (root,) = roots
    assert isinstance(root, str)
    assert len(root) == 32


async def test_a_runs_session_is_its_conversation_and_the_hops_follow_the_conventions(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    from agents import SQLiteSession

    otel_guard.configure(cycle_rule="agent")
    planner, _ = agents_as_tools_of_each_other(CallBudget(10))

    await Runner.run(planner, "Plan a trip to Lisbon.", session=SQLiteSession("trip-42"))

    (run,) = [s for s in spans.named("invoke_agent planner") if attrs(s)["otel_guard.chain.depth"] == 1]
    assert attrs(run)["gen_ai.conversation.id"] == "trip-42"
    assert_follows(run, available={"gen_ai.agent.name", "gen_ai.conversation.id"})
    for span in guard_spans(spans):
        assert_follows(span)


async def test_observe_mode_lets_the_loop_through_and_records_would_refuse(
    instrumentor: OpenAIAgentsInstrumentor, spans
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    budget = CallBudget(3)
    planner, _ = agents_as_tools_of_each_other(budget)

    result = await Runner.run(planner, "Plan a trip to Lisbon.")

    assert budget.made == 3  # the loop ran until the test model's own budget ended it
    assert "question from budget" in planner.model.user_turns()  # the nested planner ran
    assert "Refused" not in str(result.final_output)
    would = [s for s in spans.all() if attrs(s)["otel_guard.decision"] == "would_refuse"]
    assert [s.name for s in would] == ["invoke_agent budget", "invoke_agent planner"]
    for span in would:
        assert attrs(span)["otel_guard.reason"] == "cycle"
        assert attrs(span)["otel_guard.mode"] == "observe"
        assert [e.name for e in span.events] == ["otel_guard.would_refuse"]


async def test_a_refused_run_raises_to_its_caller(instrumentor: OpenAIAgentsInstrumentor) -> None:
    planner = Agent(name="planner", model=LoopModel("planner", None, CallBudget(0)))

    with otel_guard.delegate("planner"):
        with pytest.raises(otel_guard.DelegationRefused) as refused:
            await Runner.run(planner, "again")
        with pytest.raises(otel_guard.DelegationRefused):
            Runner.run_streamed(planner, "again")

    assert refused.value.reason == "cycle"
    assert planner.model.calls == []


def test_run_sync_is_guarded(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner, budget_agent = agents_as_tools_of_each_other(CallBudget(10))

    result = Runner.run_sync(planner, "Plan a trip to Lisbon.")

    assert last_tool_output(budget_agent.model).startswith(REFUSAL)
    assert str(result.final_output).startswith("planner answers: budget answers: Refused")
    assert len(spans.named("invoke_agent planner")) == 2


async def test_streamed_run_is_guarded(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    otel_guard.configure(cycle_rule="agent")
    budget = CallBudget(10)
    planner, budget_agent = agents_as_tools_of_each_other(budget)

    result = Runner.run_streamed(planner, "Plan a trip to Lisbon.")
    async for _ in result.stream_events():
        pass
    await asyncio.sleep(0)  # the run's hop ends in the run task's done callback

    assert budget.made == 2
    assert last_tool_output(budget_agent.model).startswith(REFUSAL)
    assert str(result.final_output).startswith("planner answers: budget answers: Refused")
    run_span = spans.one("invoke_agent budget").parent
    assert run_span is not None
    finished_runs = [
        s for s in spans.named("invoke_agent planner") if attrs(s)["otel_guard.decision"] == "allow"
    ]
    assert [s.context.span_id for s in finished_runs] == [run_span.span_id]


async def test_suppressed_instrumentation_makes_no_hop(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    otel_guard.configure(cycle_rule="agent")
    budget = CallBudget(4)
    planner, _ = agents_as_tools_of_each_other(budget)

    with suppress_instrumentation():
        result = await Runner.run(planner, "Plan a trip to Lisbon.")

    assert spans.all() == []
    assert budget.made == 4  # unguarded: only the test model's budget ended the loop
    assert "Refused" not in str(result.final_output)


async def test_uninstrument_restores_the_sdk(instrumentor: OpenAIAgentsInstrumentor, spans) -> None:
    otel_guard.configure(cycle_rule="agent")
    instrumentor.uninstrument()
    for target in PATCH_TARGETS:
        assert not hasattr(resolve(target), "__wrapped__"), f"{target} is still wrapped"
    assert not hasattr(AgentRunner.run, "__wrapped__")

    budget = CallBudget(4)
    planner, _ = agents_as_tools_of_each_other(budget)
    result = await Runner.run(planner, "Plan a trip to Lisbon.")

    assert spans.all() == []
    assert budget.made == 4
    assert "Refused" not in str(result.final_output)
    instrumentor.instrument()  # the fixture uninstruments again


async def test_instrument_takes_a_tracer_provider() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        planner = Agent(name="planner", model=LoopModel("planner", None, CallBudget(0)))
        await Runner.run(planner, "Plan a trip to Lisbon.")
    finally:
        instrumentor.uninstrument()
        telemetry.bind()  # back to the global providers for the other tests
    assert [s.name for s in exporter.get_finished_spans()] == ["invoke_agent planner"]


def test_the_module_imports_without_the_sdk() -> None:
    code = (
        "import sys; sys.modules['agents'] = None\n"
        "import otel_guard.instrumentation.openai_agents as m\n"
        "print(m.OpenAIAgentsInstrumentor().instrumentation_dependencies())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "openai-agents >= 0.24, < 0.25" in done.stdout


@pytest.mark.parametrize("target", PATCH_TARGETS + INTERNAL_NAMES, ids=".".join)
def test_every_sdk_name_exists_in_the_installed_version(target: tuple[str, str]) -> None:
    resolve(target)  # raises LookupError naming the target when the SDK moved or renamed it
