"""Planner and budget: two Haystack Agents that ask each other, each with a scripted chat generator.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money, and Haystack's own limit (``max_agent_steps``, per run) never meets it: every
bounce is a fresh run. Each agent has the other as a tool (Haystack's ``AgentTool``), a chain of
fresh instances, and the first runs in a ``Pipeline`` under the name ``planner``. Each agent's chat
generator is scripted (a small ``@component`` with ``run(messages, tools)``): it calls its tool
whenever a run starts, and answers in text once a tool result is back. The scripts stop after
``MAX_TOOL_CALLS`` tool calls, so that the program ends even when nothing stops the loop.

Without the guard (``python examples/haystack/app.py``) the agents bounce until the scripts give up.
Under the guard, with no change to this file::

    pip install '.[haystack]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/haystack/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's error result and answers with what it has, and so does
the planner. The spans are printed as JSON when the program ends.
"""

from __future__ import annotations

import os
from typing import Any

# Haystack sends anonymous usage telemetry unless told not to: this example sends nothing anywhere.
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from haystack import Pipeline, component
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.tools import AgentTool

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


@component
class Scripted:
    """A chat generator that calls ``other`` at the start of each run, then answers with what came back."""

    def __init__(self, agent: str, other: str) -> None:
        self.agent = agent
        self.other = other

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None) -> dict[str, list[ChatMessage]]:
        global tool_calls
        last = messages[-1]
        if last.is_from(ChatRole.TOOL) and last.tool_call_result is not None:  # a result, or an error
            print(f"  {self.agent} got: {str(last.tool_call_result.result)[:160]!r}")
            return reply(f"{self.agent}'s answer, from what {self.other} said")
        if tool_calls < MAX_TOOL_CALLS and tools:
            tool_calls += 1
            print(f"{self.agent} calls {self.other} (tool call {tool_calls})")
            task = {"messages": [{"role": "user", "content": f"asked by {self.agent}"}]}
            return reply(None, [ToolCall(self.other, task, id=f"call_{tool_calls}")])
        print(f"{self.agent}: the script gives up")
        return reply(f"{self.agent} gives up")


def reply(text: str | None, tool_calls: list[ToolCall] | None = None) -> dict[str, list[ChatMessage]]:
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    return {"replies": [ChatMessage.from_assistant(text, meta={"usage": usage}, tool_calls=tool_calls)]}


def team(depth: int) -> Agent:
    """Planner with budget as a tool, with planner as a tool, ..., ``depth`` agents deep (fresh instances)."""
    me, other = ("planner", "budget") if depth % 2 == 0 else ("budget", "planner")
    tools = []
    if depth < MAX_TOOL_CALLS:
        what = "what the plan costs" if other == "budget" else "what the plan is"
        tools = [AgentTool(team(depth + 1), name=other, description=f"Ask the {other} agent {what}.")]
    return Agent(chat_generator=Scripted(me, other), tools=tools)


def main() -> None:
    pipeline = Pipeline()
    pipeline.add_component("planner", team(0))  # the name the first agent's hop goes by
    result = pipeline.run({"planner": {"messages": [ChatMessage.from_user("Plan the team offsite")]}})
    answer = result["planner"]["last_message"].text
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
