"""Two pydantic-ai agents that delegate to each other through tools: planner -> budget -> planner.

Each agent has one tool that runs the other agent, and an offline scripted model (pydantic-ai's
``FunctionModel``) that calls that tool at the start of a run and answers in text as soon as a tool
result comes back. Left alone the two bounce forever; the scripted models bound the bouncing to
``max_tool_calls`` tool calls each, so an unguarded run still ends.

Imported by the tests, :func:`build_loop` gives the agents, their models and a count of tool-body runs.
Run as a program (``opentelemetry-instrument python pydantic_ai_app.py``), it runs the planner once
and prints one line ``RESULT {json}`` with what happened; settings come from the environment.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass, field

from pydantic_ai import Agent, Tool
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


@dataclass
class ScriptedModel:
    """Calls ``tool`` at the start of a run (``max_tool_calls`` times in all), then answers."""

    agent: str
    tool: str
    max_tool_calls: int
    requests: list[list[ModelMessage]] = field(default_factory=list)
    tool_results: list[ToolReturnPart] = field(default_factory=list)
    tool_calls: int = 0

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests.append(list(messages))
        returned = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if returned:
            self.tool_results.extend(returned)
            seen = "; ".join(f"{part.tool_name} {part.outcome}" for part in returned)
            return ModelResponse(parts=[TextPart(f"{self.agent} answers after {seen}")])
        if self.tool_calls < self.max_tool_calls:
            self.tool_calls += 1
            return ModelResponse(parts=[ToolCallPart(self.tool, {"question": f"from {self.agent}"})])
        return ModelResponse(parts=[TextPart(f"{self.agent} answers without tools")])

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request holds only the user prompt)."""
        return sum(1 for messages in self.requests if len(messages) == 1)


@dataclass
class Loop:
    planner: Agent[None, str]
    budget: Agent[None, str]
    planner_model: ScriptedModel
    budget_model: ScriptedModel
    tool_bodies: Counter[str]


def build_loop(
    *,
    planner_tool: str = "ask_budget",
    budget_tool: str = "ask_planner",
    max_tool_calls: int = 3,
    pydantic_ai_spans: bool = False,
) -> Loop:
    """Planner and budget, each with a tool (named as given) that runs the other agent."""
    tool_bodies: Counter[str] = Counter()
    planner_model = ScriptedModel("planner", planner_tool, max_tool_calls)
    budget_model = ScriptedModel("budget", budget_tool, max_tool_calls)
    capabilities = [Instrumentation()] if pydantic_ai_spans else []

    async def run_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        tool_bodies[planner_tool] += 1
        return (await budget.run(question)).output

    async def run_planner(question: str) -> str:
        """Ask the planner agent to plan."""
        tool_bodies[budget_tool] += 1
        return (await planner.run(question)).output

    planner: Agent[None, str] = Agent(
        FunctionModel(planner_model.respond),
        name="planner",
        tools=[Tool(run_budget, name=planner_tool)],
        capabilities=capabilities,
    )
    budget: Agent[None, str] = Agent(
        FunctionModel(budget_model.respond),
        name="budget",
        tools=[Tool(run_planner, name=budget_tool)],
        capabilities=capabilities,
    )
    return Loop(planner, budget, planner_model, budget_model, tool_bodies)


def main() -> None:
    loop = build_loop(pydantic_ai_spans="--pydantic-ai-spans" in sys.argv)
    output = loop.planner.run_sync("Plan the team offsite").output
    result = {
        "output": output,
        "planner_runs": loop.planner_model.runs,
        "budget_runs": loop.budget_model.runs,
        "tool_bodies": dict(loop.tool_bodies),
        "budget_saw": [[part.outcome, part.content] for part in loop.budget_model.tool_results],
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
