"""DSPy for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

A named ``dspy.ReAct`` agent on DSPy's own ``DummyLM`` (``dspy.utils.dummies``), whose scripted
answers call the tool ``lookup`` once, then ``finish``, then give the answer (ReAct's extract step):
three model requests a run. The answers are a list that never runs out (each run takes the next
three). DSPy's response cache is off for DummyLM, so every run makes its requests. DSPy is in the
main environment: ``python bench/runtime_overhead.py --runtime dspy``.
"""

from __future__ import annotations

import itertools
from typing import Any


def runtime(runtime_class: Any) -> Any:
    import dspy
    from dspy.utils.dummies import DummyLM

    from otel_guard.instrumentation.dspy import DSPyInstrumentor

    script = [
        {"next_thought": "look", "next_tool_name": "lookup", "next_tool_args": {"city": "Lisbon"}},
        {"next_thought": "done", "next_tool_name": "finish", "next_tool_args": {}},
        {"reasoning": "read it", "answer": "Lisbon: sunny"},
    ]
    lm = DummyLM(itertools.cycle(script))  # type: ignore[arg-type]  # DummyLM reads answers with next()
    lm.answers = itertools.cycle(script)

    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    agent = dspy.ReAct("question -> answer", tools=[lookup])
    agent.name = "planner"
    agent.set_lm(lm)

    async def run() -> str:
        return str(agent(question="Plan a trip to Lisbon.").answer)

    return runtime_class("dspy", run, DSPyInstrumentor(), lambda out: "sunny" in out)
