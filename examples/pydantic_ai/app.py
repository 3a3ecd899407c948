"""Planner and budget: two pydantic-ai agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Here each agent's model is scripted (pydantic-ai's ``FunctionModel``): it calls
its tool whenever a run starts, and answers in text once a tool result is back. The scripts stop
after ``MAX_TOOL_CALLS`` tool calls, so that the program ends even when nothing stops the loop.

Without the guard (``python examples/pydantic_ai/app.py``) the agents bounce until the scripts give
up. Under the guard, with no change to this file::

    pip install '.[pydantic-ai]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/pydantic_ai/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's error and answers with what it has, and so does the
planner. The spans, the guard's among them, are printed as JSON when the program ends.
"""

from __future__ import annotations

from pydantic_ai import Agent, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


def scripted(agent: str, tool: str) -> FunctionModel:
    """A model that calls ``tool`` at the start of each run, then answers with what came back."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        global tool_calls
        returned = [part for part in messages[-1].parts if isinstance(part, ToolReturnPart)]
        if returned:
            result = returned[0]
            print(f"  {agent} got {result.tool_name}'s {result.outcome} result: {str(result.content)[:160]}")
            return ModelResponse(parts=[TextPart(f"{agent}'s answer, from what {result.tool_name} said")])
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{agent} calls {tool} (tool call {tool_calls})")
            return ModelResponse(parts=[ToolCallPart(tool, {"question": f"asked by {agent}"})])
        print(f"{agent}: the script gives up")
        return ModelResponse(parts=[TextPart(f"{agent} gives up")])

    return FunctionModel(respond)


async def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return (await budget.run(question)).output


async def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return (await planner.run(question)).output


planner = Agent(scripted("planner", "ask_budget"), name="planner", tools=[Tool(ask_budget)])
budget = Agent(scripted("budget", "ask_planner"), name="budget", tools=[Tool(ask_planner)])


def main() -> None:
    answer = planner.run_sync("Plan the team offsite").output
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
