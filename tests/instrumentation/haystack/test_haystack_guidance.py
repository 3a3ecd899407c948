"""Situational guidance in Haystack: the run's newest user message, led by the guidance, when the
Agent's tools include an agent on its call path; the system prompt never changed."""

from __future__ import annotations

from typing import Any

from haystack_loop import agent_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.instrumentation.haystack import HaystackInstrumentor

instrumented = instrumentor_fixture(HaystackInstrumentor)

WARNING = "[Execution context] You are currently running INSIDE the agentic function `budget`."


def test_an_agent_that_can_call_back_up_its_path_is_told_so(instrumented: HaystackInstrumentor) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = agent_loop(depth=3, max_tool_calls=1)
    budget = loop.top.tools[0]._component
    budget.system_prompt = "You are the budget agent."  # rendered by the Agent: it must stay as it is

    loop.run()

    (request,) = loop.models_of("budget")[0].requests
    roles = [role for role, _ in request]
    assert roles == ["user"]  # the AgentTool's task: the system prompt was set after the Agent was built
    text = request[-1][1]
    assert text.startswith(WARNING)
    assert "planner → budget" in text
    assert "do NOT call `planner` either" in text
    assert text.endswith("\n\nasked by planner")


def test_an_agent_with_no_way_back_gets_nothing(instrumented: HaystackInstrumentor) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = agent_loop(depth=2, max_tool_calls=1)

    loop.run()

    (request,) = loop.models_of("budget")[0].requests
    assert request == [("user", "asked by planner")]


def test_off_by_default(instrumented: HaystackInstrumentor, spans: Any) -> None:
    loop = agent_loop(depth=3, max_tool_calls=1)

    loop.run()

    (request,) = loop.models_of("budget")[0].requests
    assert request == [("user", "asked by planner")]
