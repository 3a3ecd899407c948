"""Situational guidance in Agno: an agent (or team) that can call an agent on its call path is told so
at the start of its input, the run's user turn."""

from __future__ import annotations

from agno.agent import Agent
from agno_loop import CallBudget, scripted, team_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.instrumentation.agno import AgnoInstrumentor

instrumented = instrumentor_fixture(AgnoInstrumentor)


def test_a_member_that_can_call_back_along_its_path_is_told_at_the_start_of_its_input(
    instrumented: AgnoInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = team_loop("coordinate", calls=1)

    def planner(question: str) -> str:
        """Ask the planner team."""
        return "planned"

    loop.ask_planner = planner  # type: ignore[method-assign]  # a tool named like the team on the path
    loop.team().run("Plan the offsite")

    # The leader at the root has nobody on its path; budget, run by planner, has a planner tool.
    assert all("[Execution context]" not in turn for turn in loop.leader_model.user_turns)
    (first,) = loop.budget_model.user_turns
    assert "[Execution context] You are currently running INSIDE the agentic function `budget`" in first
    assert "do NOT call `planner` either" in first
    assert first.endswith("price the plan")


def test_no_guidance_when_off_or_when_nothing_callable_is_on_the_path(instrumented: AgnoInstrumentor) -> None:
    model = scripted("planner", "", CallBudget(0))
    Agent(name="planner", model=model, telemetry=False).run("offsite")
    otel_guard.configure(situational_prompt=True)
    Agent(name="planner", model=model, telemetry=False).run("offsite")
    assert all("[Execution context]" not in turn for turn in model.user_turns)
