"""Google ADK under otel-guard: transfers (``transfer_to_agent``) and sub-agents called as tools
(``mode="single_turn"``) or given tasks (``mode="task"``) are hops into the agent, decided when the
model asks, so a bounce back to an agent on the path is refused and the model reads why.

ADK 2 runs these agents outside the calling agent's run (a transfer's target after it, a sub-agent in
the context ADK captured before the call): the chain must reach them all the same.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools.agent_tool import AgentTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from google_adk_models import ScriptedModel, Seen, ToolCalls, final_text, run, transferring_agents
from google_adk_spans import decisions, guard_spans, parent_of
from opentelemetry.trace import StatusCode

import otel_guard
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(GoogleADKInstrumentor)


# -- transfers ----------------------------------------------------------------------------------


async def test_a_transfer_back_to_an_agent_on_the_path_is_refused_and_the_agent_answers(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents()

    events = await run(pair.planner)

    assert pair.tool_calls.left == 6 - 2  # planner -> budget, then budget -> planner: refused
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    (error,) = pair.budget_model.errors
    assert "Delegation cycle: agent planner is already in chain planner → budget" in error
    # No transfer happened: budget stayed in charge, read the refusal as its tool error, answered.
    assert len(pair.planner_model.requests) == 1
    assert final_text(events) == "budget answers after transfer_to_agent error"
    assert events[-1].author == "budget"


async def test_without_the_guard_the_agents_transfer_until_the_scripts_give_up(spans: Any) -> None:
    pair = transferring_agents()

    await run(pair.planner)

    assert pair.tool_calls.left == 0
    assert guard_spans(spans) == []


async def test_a_transfers_hop_is_opened_by_its_target_under_the_call_that_asked_for_it(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents(max_tool_calls=1)  # planner -> budget; budget answers

    events = await run(pair.planner)

    assert final_text(events) == "budget answers without tools"
    transfer = next(s for s in guard_spans(spans) if s.name == "invoke_agent budget")
    # The transfer_to_agent tool is no hop: the hop is the target's, and no name stands twice.
    assert transfer.attributes is not None
    assert transfer.attributes["otel_guard.chain.agents"] == ("planner", "budget")
    assert parent_of(transfer, spans).name == "execute_tool transfer_to_agent"  # ADK's span of the call
    adk_budget = [s for s in spans.named("invoke_agent budget") if s is not transfer]
    assert [parent_of(s, spans) for s in adk_budget] == [transfer]  # ADK's run of budget, inside ours


async def test_a_transfer_onward_to_a_peer_carries_the_whole_path(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    calls = ToolCalls(2)
    fx = LlmAgent(name="fx", model=ScriptedModel(agent="fx"))
    budget = LlmAgent(
        name="budget",
        model=ScriptedModel(
            agent="budget", tool="transfer_to_agent", tool_args={"agent_name": "fx"}, tool_calls=calls
        ),
    )
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="transfer_to_agent", tool_args={"agent_name": "budget"}, tool_calls=calls
        ),
        sub_agents=[budget, fx],
    )

    events = await run(planner)

    assert final_text(events) == "fx answers without tools"
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent fx", "allow", ("planner", "budget", "fx")),
    ]


async def test_a_tool_of_its_own_that_transfers_back_is_refused_and_the_transfer_withdrawn(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    pair = transferring_agents()
    bodies: list[str] = []

    def hand_back(tool_context: ToolContext) -> str:
        """Hand the conversation back to the planner."""
        bodies.append("hand_back")
        tool_context.actions.transfer_to_agent = "planner"
        return "handing back"

    pair.budget.tools = [hand_back]
    budget_model: ScriptedModel = pair.budget.model  # type: ignore[assignment]
    budget_model.tool, budget_model.tool_args = "hand_back", {}

    events = await run(pair.planner)

    assert bodies == ["hand_back"]  # the tool ran (a hop of its own); the transfer it asked for did not
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("execute_tool hand_back", "allow", ("planner", "budget", "hand_back")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert "already in chain planner → budget" in pair.budget_model.errors[0]
    assert events[-1].author == "budget"


async def test_observe_mode_lets_the_transfers_through_and_records_would_refuse(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(mode="observe", max_depth=32, max_name_depth=32)
    pair = transferring_agents(max_tool_calls=4)

    await run(pair.planner)

    assert pair.tool_calls.left == 0
    assert pair.budget_model.errors == []
    would = [d for d in decisions(spans) if d[1] == "would_refuse"]
    assert would[0] == ("invoke_agent planner", "would_refuse", ("planner", "budget", "planner"))


async def test_a_transfer_whose_target_never_runs_is_still_recorded(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(agent="planner", tool="leave", tool_args={}, tool_calls=ToolCalls(1)),
    )

    def leave(tool_context: ToolContext) -> str:
        """Transfer to an agent that is not in the tree."""
        tool_context.actions.transfer_to_agent = "nowhere"
        return "leaving"

    planner.tools = [leave]

    with pytest.raises(ValueError, match="nowhere"):  # ADK's own answer to the unknown target
        await run(planner)

    (hop,) = [s for s in guard_spans(spans) if s.name == "invoke_agent nowhere"]
    assert hop.attributes is not None
    assert hop.attributes["otel_guard.chain.agents"] == ("planner", "nowhere")
    assert hop.status.status_code == StatusCode.ERROR  # ended with the run's error


# -- sub-agents as tools ------------------------------------------------------------------------


async def test_a_single_turn_sub_agent_is_one_hop_and_its_call_back_is_refused(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    calls = ToolCalls(6)
    budget = LlmAgent(
        name="budget",
        mode="single_turn",
        model=ScriptedModel(agent="budget", tool="planner", tool_calls=calls),
    )
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="budget", tool_args={"request": "price it"}, tool_calls=calls
        ),
        sub_agents=[budget],
    )
    budget.tools.append(AgentTool(planner))

    events = await run(planner)

    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert calls.left == 6 - 2
    assert final_text(events) == "planner answers after budget ok"


class TaskModel(ScriptedModel):
    """A task agent's script: calls its tool once, then ``finish_task`` with what came back."""

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(Seen.of(llm_request))
        newest = llm_request.contents[-1]
        returned = [p.function_response for p in newest.parts or [] if p.function_response]
        self.function_responses.extend(r for r in returned if r is not None)
        if returned and returned[0] is not None and returned[0].name == "finish_task":
            part = types.Part.from_text(text=f"{self.agent} is done")
        elif returned:
            part = types.Part.from_function_call(
                name="finish_task", args={"result": f"{self.agent}'s result"}
            )
        else:
            part = types.Part.from_function_call(name=self.tool, args={"request": "the plan?"})
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def planner_with_task_budget() -> tuple[LlmAgent, LlmAgent]:
    budget = LlmAgent(name="budget", mode="task", model=TaskModel(agent="budget", tool="planner"))
    planner = LlmAgent(
        name="planner",
        model=ScriptedModel(
            agent="planner", tool="budget", tool_args={"request": "price it"}, tool_calls=ToolCalls(1)
        ),
        sub_agents=[budget],
    )
    budget.tools.append(AgentTool(planner))
    return planner, budget


async def test_a_task_agent_runs_inside_its_coordinators_chain(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    planner, budget = planner_with_task_budget()

    events = await run(planner)

    # ADK dispatches the task itself (no tool callback), and re-enters the planner after it: one hop.
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "refuse", ("planner", "budget", "planner")),
    ]
    assert "already in chain planner → budget" in budget.model.errors[0]  # type: ignore[union-attr]
    assert final_text(events) == "planner answers after budget ok"


async def test_a_refused_task_delegation_answers_the_coordinator_with_the_refusal(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    planner, budget = planner_with_task_budget()

    with otel_guard.delegate("budget"):  # budget is already on the path: the task call is a cycle
        events = await run(planner)

    assert budget.model.requests == []  # type: ignore[union-attr]  # the task agent never ran
    (error,) = planner.model.errors  # type: ignore[union-attr]
    assert "Delegation cycle: agent budget is already in chain budget → planner" in error
    assert final_text(events) == "planner answers after budget error"
    assert decisions(spans)[-1] == ("invoke_agent budget", "refuse", ("budget", "planner", "budget"))
