"""The patched methods as LlamaIndex sees them on an agent: the same steps and the same signatures.

The agents are real ``FunctionAgent`` s on LlamaIndex's offline ``MockFunctionCallingLLM``.
"""

from __future__ import annotations

import inspect

from instrumentors import instrumentor_fixture
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.tools import FunctionTool
from llama_index_loop import CallBudget, ScriptedModel, agent

from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor

instrumented = instrumentor_fixture(LlamaIndexInstrumentor)


def searcher() -> FunctionAgent:
    def lookup(question: str) -> str:
        """Look something up."""
        return question.upper()

    model = ScriptedModel("searcher", "lookup", CallBudget(1))
    return agent("searcher", model, [FunctionTool.from_defaults(fn=lookup)])


async def test_an_agent_has_the_same_steps_and_signatures_guarded(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    guarded = searcher()
    steps = sorted(guarded._get_steps())
    signatures = {
        name: inspect.signature(getattr(guarded, name)) for name in ("run", "_call_tool", "take_step")
    }
    instrumented.uninstrument()
    try:
        bare = searcher()
        bare_steps = sorted(bare._get_steps())
        bare_signatures = {name: inspect.signature(getattr(bare, name)) for name in signatures}
    finally:
        instrumented.instrument()  # the fixture uninstruments what it instrumented

    assert bare_steps == steps
    assert bare_signatures == signatures


def test_the_class_holds_a_function_for_the_method_and_an_agent_gets_a_method_of_the_agent(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    one = searcher()
    guarded = FunctionAgent.__dict__["take_step"]

    # A plain function (bound in C when read off an agent), standing for the method it wraps.
    assert inspect.isfunction(guarded)
    assert guarded.__wrapped__.__qualname__ == "FunctionAgent.take_step"
    assert guarded.__wrapped__ is not guarded
    assert inspect.ismethod(one.take_step)
    assert one.take_step.__self__ is one
    assert one.take_step.__name__ == "take_step"
