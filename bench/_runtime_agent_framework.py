"""Microsoft Agent Framework for ``bench/runtime_overhead.py``: one offline run that makes one tool call.

An ``Agent`` whose scripted chat client (``BaseChatClient`` under Agent Framework's function-invocation,
chat-middleware and telemetry layers, as its own test suite builds one) calls the tool ``lookup`` once
on the user's turn, then answers with the tool's result. Agent Framework's own tracing stays on, as it
is by default: its spans go to the bench's SDK in both arms. The guard adds its middleware to an agent
as it is built, and ``uninstrument()`` takes it off again, so each arm runs an agent of its own, built
before the round (outside the timing) when the arm has none yet: the bare arm's has none of the
guard's middleware, the guarded arm's has it.

Run it with the Agent Framework environment: ``.venv-runtimes/agent-framework/bin/python
bench/runtime_overhead.py --runtime agent-framework``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def runtime(runtime_class: Any) -> Any:
    from agent_framework import (
        Agent,
        BaseChatClient,
        ChatMiddlewareLayer,
        ChatResponse,
        Content,
        FunctionInvocationLayer,
        Message,
        tool,
    )
    from agent_framework.observability import ChatTelemetryLayer

    from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor
    from otel_guard.instrumentation.agent_framework._runs import RUNS

    class OneToolClient(
        FunctionInvocationLayer[Any], ChatMiddlewareLayer[Any], ChatTelemetryLayer[Any], BaseChatClient[Any]
    ):
        """Calls ``lookup`` on a user turn, answers from a tool result."""

        model = "bench"

        def _inner_get_response(self, *, messages: Sequence[Message], stream: bool, **kwargs: Any) -> Any:
            returned = [c for c in messages[-1].contents if c.type == "function_result"]
            if returned:
                reply = Message(role="assistant", contents=[f"planner answers: {returned[0].result}"])
            else:
                call = Content.from_function_call("call_1", "lookup", arguments={"city": "Lisbon"})
                reply = Message(role="assistant", contents=[call])

            async def response() -> ChatResponse[Any]:
                return ChatResponse(messages=[reply], finish_reason="stop")

            return response()

    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        return f"{city}: sunny"

    client = OneToolClient()
    instrumentor = AgentFrameworkInstrumentor()
    agents: dict[bool, Any] = {}  # guarded or not -> the agent built in that state

    def agent_of_this_arm() -> Any:
        guarded = instrumentor.is_instrumented_by_opentelemetry
        agent = agents.get(guarded)
        if agent is None or guarded != (RUNS in (agent.middleware or ())):
            agent = agents[guarded] = Agent(client=client, name="planner", tools=[lookup])
        return agent

    async def open_arm() -> None:
        agent_of_this_arm()

    async def run() -> str:
        return str((await agent_of_this_arm().run("Plan a trip to Lisbon.")).text)

    return runtime_class("agent-framework", run, instrumentor, lambda out: "sunny" in out, open=open_arm)
