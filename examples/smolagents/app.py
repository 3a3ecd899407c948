"""Planner and budget: two smolagents agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money, and smolagents' own limit (``max_steps``, per run) never meets it: every bounce is
a fresh run. Each agent is the other's managed agent (smolagents' ``managed_agents``), a chain of
fresh instances, since a smolagents agent run again inside its own run would overwrite its memory.
Each agent's model is scripted (a small subclass of ``smolagents.Model``): it calls its managed agent
whenever a run starts, and gives its final answer once something comes back. The scripts stop after
``MAX_TOOL_CALLS`` calls, so that the program ends even when nothing stops the loop.

Without the guard (``python examples/smolagents/app.py``) the agents bounce until the scripts give
up. Under the guard, with no change to this file::

    pip install '.[smolagents]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/smolagents/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its step's error and answers with what it has, and so does the
planner. The spans are printed as JSON when the program ends.
"""

from __future__ import annotations

from typing import Any

from smolagents import ChatMessage, LogLevel, MessageRole, Model, ToolCallingAgent
from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


class Scripted(Model):
    """A model that calls ``other`` at the start of each run, then answers with what came back."""

    def __init__(self, agent: str, other: str) -> None:
        super().__init__(model_id=f"scripted-{agent}")
        self.agent = agent
        self.other = other

    def generate(self, messages: list[ChatMessage], **kwargs: Any) -> ChatMessage:
        global tool_calls
        last = messages[-1]
        text = "".join(block.get("text", "") for block in last.content or [])
        if last.role == MessageRole.TOOL_RESPONSE:  # an observation, or a step's error
            print(f"  {self.agent} got: {text[:160]!r}")
            return call("final_answer", {"answer": f"{self.agent}'s answer, from what {self.other} said"})
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.other} (tool call {tool_calls})")
            return call(self.other, {"task": f"asked by {self.agent}"})
        print(f"{self.agent}: the script gives up")
        return call("final_answer", {"answer": f"{self.agent} gives up"})


def call(name: str, arguments: dict[str, Any]) -> ChatMessage:
    """A model response: one tool call (a managed agent is called like a tool)."""
    function = ChatMessageToolCallFunction(name=name, arguments=arguments)
    tool_call = ChatMessageToolCall(id=f"call_{tool_calls}_{name}", type="function", function=function)
    return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[tool_call])


def team(depth: int) -> ToolCallingAgent:
    """Planner managing budget managing planner ..., ``depth`` agents deep (fresh instances)."""
    me, other = ("planner", "budget") if depth % 2 == 0 else ("budget", "planner")
    managed = [team(depth + 1)] if depth < MAX_TOOL_CALLS else []
    return ToolCallingAgent(
        tools=[],
        model=Scripted(me, other),
        managed_agents=managed,
        name=me,
        description=f"The {me} agent: ask it what the {'plan is' if me == 'planner' else 'plan costs'}.",
        verbosity_level=LogLevel.OFF,  # smolagents prints every step at its default level
    )


def main() -> None:
    answer = team(0).run("Plan the team offsite")
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
