"""Strands Agents for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

An ``Agent`` whose scripted model (a small subclass of ``strands.models.Model``, streaming Strands'
own events) calls the tool ``lookup`` once on the user's turn, then answers with the tool's result.
Strands' own tracing stays on, as it is in every Strands program: its spans go to the bench's SDK
in both arms. The guard adds its hooks to an agent as it is built, so each arm runs an agent of its
own, built once (outside the timing) the first time the arm runs: the bare arm's has none of the
guard's hooks, the guarded arm's has them all.

Run it with the Strands environment: ``.venv-runtimes/strands/bin/python bench/runtime_overhead.py
--runtime strands``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any


def runtime(runtime_class: Any) -> Any:
    from strands import Agent, tool
    from strands.models import Model

    from otel_guard.instrumentation.strands import StrandsInstrumentor

    class OneToolModel(Model):
        """Calls ``lookup`` on a user turn, answers from a tool result."""

        def update_config(self, **model_config: Any) -> None:
            pass

        def get_config(self) -> dict[str, Any]:
            return {"model_id": "bench"}

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            for event in _respond(messages):
                yield event

    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    model = OneToolModel()
    instrumentor = StrandsInstrumentor()
    agents: dict[bool, Any] = {}  # guarded or not -> the agent built in that state

    def agent_of_this_arm() -> Any:
        guarded = instrumentor.is_instrumented_by_opentelemetry
        if guarded not in agents:
            agents[guarded] = Agent(name="planner", model=model, tools=[lookup], callback_handler=None)
        return agents[guarded]

    async def run() -> str:
        agent = agent_of_this_arm()
        agent.messages = []  # every run starts a fresh conversation, as a request to a service would
        return str(await agent.invoke_async("Plan a trip to Lisbon."))

    return runtime_class("strands", run, instrumentor, lambda out: "sunny" in out)


def _respond(messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    returned = [block["toolResult"] for block in messages[-1]["content"] if "toolResult" in block]
    yield {"messageStart": {"role": "assistant"}}
    if returned:
        text = returned[0]["content"][0]["text"]
        yield {"contentBlockStart": {"start": {}}}
        yield {"contentBlockDelta": {"delta": {"text": f"planner answers: {text}"}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}
        return
    yield {"contentBlockStart": {"start": {"toolUse": {"name": "lookup", "toolUseId": "call_1"}}}}
    yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps({"city": "Lisbon"})}}}}
    yield {"contentBlockStop": {}}
    yield {"messageStop": {"stopReason": "tool_use"}}
