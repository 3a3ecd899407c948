"""Situational guidance in DSPy: a ReAct module that can call an agent on its call path is told so at
the start of its first text input, the user turn of its every model request."""

from __future__ import annotations

from dspy_loop import build_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.instrumentation.dspy import DSPyInstrumentor

instrumented = instrumentor_fixture(DSPyInstrumentor)


def test_a_module_that_can_call_back_along_its_path_is_told_at_the_start_of_its_input(
    instrumented: DSPyInstrumentor,
) -> None:
    otel_guard.configure(situational_prompt=True)
    loop = build_loop(calls=1, as_tools=True)

    loop.planner()(question="Plan the team offsite")

    # Planner at the root has no caller on its path; budget, called by planner, has a planner tool.
    assert all("[Execution context]" not in turn for turn in loop.planner_lm.user_turns)
    first = loop.budget_lm.user_turns[0]
    assert "[Execution context] You are currently running INSIDE the agentic function `budget`" in first
    assert "do NOT call `planner` either" in first
    assert first.index("[Execution context]") < first.index("planner asks")
    # The system prompt (the signature's instructions) is never changed.
    assert "[Execution context]" not in str(loop.budget_lm.history[0]["messages"][0]["content"])


def test_no_guidance_when_off(instrumented: DSPyInstrumentor) -> None:
    loop = build_loop(calls=1, as_tools=True)
    loop.planner()(question="Plan the team offsite")
    assert all("[Execution context]" not in turn for turn in loop.budget_lm.user_turns)
