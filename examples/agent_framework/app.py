"""Planner and budget: two Microsoft Agent Framework agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Each agent has a tool that runs the other agent. Each agent's model is a scripted
chat client (``BaseChatClient`` under Agent Framework's function-calling, middleware and telemetry
layers, as its own test suite builds one): it calls its tool whenever a run starts, and answers in text once a
tool result is back. The scripts stop after ``MAX_TOOL_CALLS`` tool calls, so that the program ends
even when nothing stops the loop. Agent Framework's own limit (``max_iterations``, 40) is per run:
every bounce is a fresh run, so it never meets it.

Without the guard (``python examples/agent_framework/app.py``) the agents bounce until the scripts
give up. Under the guard, with no change to this file::

    pip install '.[agent-framework]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/agent_framework/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's result and answers with what it has, and so does the
planner. The spans, Agent Framework's own and the guard's, are printed as JSON when the program ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agent_framework import (
    Agent,
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    Message,
    ResponseStream,
    tool,
)
from agent_framework.observability import ChatTelemetryLayer

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


class Scripted(
    FunctionInvocationLayer[Any], ChatMiddlewareLayer[Any], ChatTelemetryLayer[Any], BaseChatClient[Any]
):
    """A model that calls ``tool`` at the start of each run, then answers with what came back."""

    def __init__(self, agent: str, tool: str) -> None:
        super().__init__()
        self.agent = agent
        self.tool = tool
        self.model = f"scripted-{agent}"  # the model Agent Framework's chat spans name

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: dict[str, Any], **kwargs: Any
    ) -> Any:
        reply = self.respond(messages)
        if stream:  # an agent run as a tool (agent.as_tool()) streams its model's answer

            async def updates() -> AsyncIterator[ChatResponseUpdate]:
                yield ChatResponseUpdate(role="assistant", contents=reply.contents, finish_reason="stop")

            return ResponseStream(updates(), finalizer=ChatResponse.from_updates)

        async def response() -> ChatResponse[Any]:
            return ChatResponse(messages=[reply], finish_reason="stop")

        return response()

    def respond(self, messages: Sequence[Message]) -> Message:
        global tool_calls
        returned = [content for content in messages[-1].contents if content.type == "function_result"]
        if returned:
            result = returned[0]
            name = tool_name_of(messages, result.call_id)
            print(f"  {self.agent} got {name}'s result: {str(result.result)[:160]}")
            return Message(role="assistant", contents=[f"{self.agent}'s answer, from what {name} said"])
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.tool} (tool call {tool_calls})")
            arguments = {"question": f"asked by {self.agent}"}
            call = Content.from_function_call(f"call_{tool_calls}", self.tool, arguments=arguments)
            return Message(role="assistant", contents=[call])
        print(f"{self.agent}: the script gives up")
        return Message(role="assistant", contents=[f"{self.agent} gives up"])


def tool_name_of(messages: Sequence[Message], call_id: str | None) -> str:
    """The name of the tool the model called with ``call_id``."""
    for message in messages:
        for content in message.contents:
            if content.type == "function_call" and content.call_id == call_id:
                return str(content.name)
    return "a tool"


@tool
async def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return (await budget.run(question)).text


@tool
async def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return (await planner.run(question)).text


planner = Agent(
    client=Scripted("planner", "ask_budget"), name="planner", instructions="You plan.", tools=[ask_budget]
)
budget = Agent(
    client=Scripted("budget", "ask_planner"),
    name="budget",
    instructions="You price plans.",
    tools=[ask_planner],
)


async def main() -> None:
    answer = (await planner.run("Plan the team offsite")).text
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    asyncio.run(main())
