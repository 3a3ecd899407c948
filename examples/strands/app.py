"""Planner and budget: two Strands agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Each tool builds a fresh agent and runs it (Strands' "agents as tools" pattern; a
Strands agent refuses to be re-entered while it runs, so a loop between agents is a loop of fresh
instances). Each agent's model is scripted (a small subclass of ``strands.models.Model``): it calls
its tool whenever a run starts, and answers in text once a tool result is back. The scripts stop
after ``MAX_TOOL_CALLS`` tool calls, so that the program ends even when nothing stops the loop.

Without the guard (``python examples/strands/app.py``) the agents bounce until the scripts give up.
Under the guard, with no change to this file::

    pip install '.[strands]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/strands/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's error and answers with what it has, and so does the
planner. The spans, Strands' own and the guard's, are printed as JSON when the program ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from strands import Agent, tool
from strands.models import Model

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


class Scripted(Model):
    """A model that calls ``tool`` at the start of each run, then answers with what came back."""

    def __init__(self, agent: str, tool: str) -> None:
        self.agent = agent
        self.tool = tool

    def update_config(self, **model_config: Any) -> None:
        pass  # nothing to configure offline

    def get_config(self) -> dict[str, Any]:
        return {"model_id": f"scripted-{self.agent}"}

    def structured_output(
        self, output_model: Any, prompt: Any, system_prompt: str | None = None, **kwargs: Any
    ) -> Any:
        raise NotImplementedError("this model only answers in text")

    async def stream(
        self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        for event in self.respond(messages):
            yield event

    def respond(self, messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        global tool_calls
        returned = [block["toolResult"] for block in messages[-1]["content"] if "toolResult" in block]
        if returned:
            result = returned[0]
            name = tool_name_of(messages, result["toolUseId"])
            text = " ".join(block.get("text", "") for block in result["content"])
            print(f"  {self.agent} got {name}'s {result['status']} result: {text[:160]}")
            return say(f"{self.agent}'s answer, from what {name} said")
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.tool} (tool call {tool_calls})")
            return call(self.tool, {"question": f"asked by {self.agent}"}, f"call_{tool_calls}")
        print(f"{self.agent}: the script gives up")
        return say(f"{self.agent} gives up")


def tool_name_of(messages: list[dict[str, Any]], tool_use_id: str) -> str:
    """The name of the tool the model called with ``tool_use_id``."""
    for message in messages:
        for block in message["content"]:
            if block.get("toolUse", {}).get("toolUseId") == tool_use_id:
                return str(block["toolUse"]["name"])
    return "a tool"


def say(text: str) -> Iterator[dict[str, Any]]:
    """A model response in Strands' stream events: one text block."""
    yield {"messageStart": {"role": "assistant"}}
    yield {"contentBlockStart": {"start": {}}}
    yield {"contentBlockDelta": {"delta": {"text": text}}}
    yield {"contentBlockStop": {}}
    yield {"messageStop": {"stopReason": "end_turn"}}


def call(name: str, arguments: dict[str, Any], tool_use_id: str) -> Iterator[dict[str, Any]]:
    """A model response in Strands' stream events: one tool call."""
    yield {"messageStart": {"role": "assistant"}}
    yield {"contentBlockStart": {"start": {"toolUse": {"name": name, "toolUseId": tool_use_id}}}}
    yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments)}}}}
    yield {"contentBlockStop": {}}
    yield {"messageStop": {"stopReason": "tool_use"}}


@tool
async def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return str(await budget().invoke_async(question)).strip()


@tool
async def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return str(await planner().invoke_async(question)).strip()


def planner() -> Agent:
    # callback_handler=None: Strands' default handler prints every streamed token.
    return Agent(
        name="planner", model=Scripted("planner", "ask_budget"), tools=[ask_budget], callback_handler=None
    )


def budget() -> Agent:
    return Agent(
        name="budget", model=Scripted("budget", "ask_planner"), tools=[ask_planner], callback_handler=None
    )


def main() -> None:
    answer = str(planner()("Plan the team offsite")).strip()
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
