"""Agno for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

An ``agno.agent.Agent`` named ``planner`` whose scripted model (a small subclass of
``agno.models.base.Model``) calls the tool ``lookup`` once, then answers with its result: two model
requests a run. Agno's telemetry is off. Agno is in the main environment:
``python bench/runtime_overhead.py --runtime agno``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any


def runtime(runtime_class: Any) -> Any:
    os.environ.setdefault("AGNO_TELEMETRY", "false")
    from agno.agent import Agent
    from agno.models.base import Model
    from agno.models.message import Message
    from agno.models.response import ModelResponse

    from otel_guard.instrumentation.agno import AgnoInstrumentor

    @dataclass
    class OneToolModel(Model):
        """Calls ``lookup`` on the task, answers from the tool's result."""

        def invoke(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> ModelResponse:
            last = messages[-1]
            if last.role == "tool":
                return ModelResponse(role="assistant", content=f"planner answers: {last.content}")
            call = {"name": "lookup", "arguments": '{"city": "Lisbon"}'}
            return ModelResponse(
                role="assistant", tool_calls=[{"id": "call_1", "type": "function", "function": call}]
            )

        async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self.invoke(*args, **kwargs)

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Iterator[ModelResponse]:
            yield self.invoke(*args, **kwargs)

        async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ModelResponse]:
            yield self.invoke(*args, **kwargs)

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
            return response  # type: ignore[no-any-return]

        def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
            return response  # type: ignore[no-any-return]

    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    model = OneToolModel(id="bench", name="planner", provider="offline")
    agent = Agent(name="planner", model=model, tools=[lookup], telemetry=False)

    async def run() -> str:
        return str(agent.run("Plan a trip to Lisbon.").content)

    return runtime_class("agno", run, AgnoInstrumentor(), lambda out: "sunny" in out)
