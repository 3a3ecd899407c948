"""Planner and budget: an Agno team and its member that ask each other, each with a scripted model.

The planner team's leader delegates to its member, the budget agent, to price the offsite; the
budget agent asks the planner team what the plan is; the planner team delegates to budget again, and
so on. With a real model, that is the loop that burns money, and Agno's own limit
(``tool_call_limit``, per run) never meets it: every bounce is a fresh run. Each model is scripted (a
small subclass of Agno's ``agno.models.base.Model``): it calls its tool whenever a run starts, and
answers once something comes back. The scripts stop after ``MAX_TOOL_CALLS`` calls, so that the
program ends even when nothing stops the loop.

Without the guard (``python examples/agno/app.py``) the team and its member bounce until the scripts
give up. Under the guard, with no change to this file::

    pip install '.[agno]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/agno/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool call's error result and answers with what it has, and so
does the planner. The spans are printed as JSON when the program ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("AGNO_TELEMETRY", "false")  # no analytics calls to Agno's servers

from agno.agent import Agent
from agno.models.base import Model
from agno.models.message import Message
from agno.models.response import ModelResponse
from agno.team import Team

MAX_TOOL_CALLS = 6  # in all, both sides: where the scripts give up when nothing else stops them
tool_calls = 0


@dataclass
class Scripted(Model):
    """A model that calls ``tool`` with ``arguments`` at the start of each run, then answers with
    what came back."""

    tool: str = ""
    arguments: str = "{}"

    def invoke(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> ModelResponse:
        global tool_calls
        last = messages[-1]
        if last.role == "tool":  # a tool's result, or its error
            print(f"  {self.name} got: {str(last.content)[:200]!r}")
            return ModelResponse(role="assistant", content=f"{self.name}'s answer, from what came back")
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.name} calls {self.tool} (tool call {tool_calls})")
            call = {"id": f"call_{tool_calls}", "type": "function",
                    "function": {"name": self.tool, "arguments": self.arguments}}  # fmt: skip
            return ModelResponse(role="assistant", tool_calls=[call])
        print(f"{self.name}: the script gives up")
        return ModelResponse(role="assistant", content=f"{self.name} gives up")

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


def ask_planner(question: str) -> str:
    """Ask the planner team what the plan is."""
    return str(planner_team().run(question).content)


def planner_team() -> Team:
    """The planner team: its leader delegates the pricing to its member, the budget agent."""
    delegate = json.dumps({"member_id": "budget", "task": "What does the offsite cost?"})
    budget = Agent(
        name="budget",
        id="budget",
        role="Prices the plan.",
        model=Scripted(
            id="scripted", name="budget", tool="ask_planner", arguments='{"question": "the plan?"}'
        ),
        tools=[ask_planner],
        telemetry=False,
    )
    leader = Scripted(id="scripted", name="planner", tool="delegate_task_to_member", arguments=delegate)
    return Team(name="planner", members=[budget], model=leader, telemetry=False)


def main() -> None:
    answer = planner_team().run("Plan the team offsite").content
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
