"""CrewAI's run for bench/runtime_overhead.py: an ``Agent`` whose scripted model calls ``lookup`` once.

The model is a small subclass of CrewAI's ``BaseLLM`` speaking native function calling: it asks for
the tool on the user turn and answers from the tool's result. The run is ``Agent.kickoff_async`` (the
bench runs in an event loop), which builds a fresh executor each time, so each arm runs with exactly
the hooks it has. CrewAI's own telemetry and trace collection are off, and its console panels too.
Run it with the CrewAI environment's interpreter::

    .venv-runtimes/crewai/bin/python bench/runtime_overhead.py --runtime crewai --rounds 20
"""

from __future__ import annotations

import json
import os
from typing import Any


def runtime(runtime_class: Any) -> Any:
    os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # before CrewAI loads: it would send
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    from crewai import Agent
    from crewai.events.event_listener import event_listener
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool

    from otel_guard.instrumentation.crewai import CrewAIInstrumentor

    event_listener.formatter.verbose = False

    class OneToolModel(BaseLLM):
        """Calls ``lookup`` on the user turn, answers from a tool result."""

        def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
            last = messages[-1]
            if last["role"] == "tool":
                return f"planner answers: {last['content']}"
            arguments = json.dumps({"city": "Lisbon"})
            return [{"id": "call_1", "function": {"name": "lookup", "arguments": arguments}}]

        def supports_function_calling(self) -> bool:
            return True

        def get_input_tokens_count(self, messages: Any, *args: Any, **kwargs: Any) -> int:
            return len(str(messages)) // 4

    @tool("lookup")
    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    agent = Agent(
        role="planner",
        goal="Plan a trip",
        backstory="Plans trips.",
        llm=OneToolModel(model="scripted"),
        tools=[lookup],
    )

    async def run() -> str:
        return str((await agent.kickoff_async("Plan a trip to Lisbon.")).raw)

    built: Any = runtime_class("crewai", run, CrewAIInstrumentor(), lambda out: "sunny" in out)
    return built
