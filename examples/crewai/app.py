"""Planner and budget: two CrewAI agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Here each agent's model is scripted (a small subclass of CrewAI's ``BaseLLM``,
speaking native function calling): it calls its tool whenever a run starts, and answers in text once
a tool result is back. The scripts stop after ``MAX_TOOL_CALLS`` tool calls, so that the program ends
even when nothing stops the loop.

Without the guard (``python examples/crewai/app.py``) the agents bounce until the scripts give up.
Under the guard, with no change to this file::

    pip install '.[crewai]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/crewai/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's result and answers with what it has, and so does the
planner. The spans, the guard's among them, are printed as JSON when the program ends.
"""

from __future__ import annotations

import json
import os
from typing import Any

# CrewAI's own telemetry and trace collection send to CrewAI's servers; this program stays offline.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import Agent
from crewai.events.event_listener import event_listener
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


class Scripted(BaseLLM):
    """A model that calls ``tool`` at the start of each run, then answers with what came back."""

    agent: str
    tool: str

    def call(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
        global tool_calls
        last = messages[-1]
        if last["role"] == "tool":
            print(f"  {self.agent} got {last['name']}'s result: {str(last['content'])[:160]}")
            return f"{self.agent}'s answer, from what {last['name']} said"
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.tool} (tool call {tool_calls})")
            arguments = json.dumps({"question": f"asked by {self.agent}"})
            return [{"id": f"call_{tool_calls}", "function": {"name": self.tool, "arguments": arguments}}]
        print(f"{self.agent}: the script gives up")
        return f"{self.agent} gives up"

    def supports_function_calling(self) -> bool:
        return True

    def get_input_tokens_count(self, messages: Any, *args: Any, **kwargs: Any) -> int:
        return len(str(messages)) // 4  # a scripted model has no tokenizer to ask


@tool("ask_budget")
def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return str(budget.kickoff(question).raw)


@tool("ask_planner")
def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return str(planner.kickoff(question).raw)


planner = Agent(
    role="planner",
    goal="Plan the team offsite",
    backstory="Plans offsites.",
    llm=Scripted(model="scripted", agent="planner", tool="ask_budget"),
    tools=[ask_budget],
)
budget = Agent(
    role="budget",
    goal="Price the plan",
    backstory="Knows what things cost.",
    llm=Scripted(model="scripted", agent="budget", tool="ask_planner"),
    tools=[ask_planner],
)


def main() -> None:
    # CrewAI would draw a panel per agent run from a background thread, in among these lines.
    event_listener.formatter.verbose = False
    answer = planner.kickoff("Plan the team offsite").raw
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
