"""Planner and budget: two OpenAI Agents SDK agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop
that burns money. Here each agent is the other's tool (``Agent.as_tool``) and each agent's model is
scripted (the SDK's ``agents.testing.ScriptedModel``): it calls its tool whenever a run starts, and
answers in text once a tool result is back. The scripts stop after ``MAX_TOOL_CALLS`` tool calls, so
that the program ends even when nothing stops the loop. No API key, no network.

Without the guard (``python examples/openai_agents/app.py``) the agents bounce until the scripts give
up. Under the guard, with no change to this file::

    pip install '.[openai-agents]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/openai_agents/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's result and answers with what it has, and so does the
planner. The spans, the guard's among them, are printed as JSON when the program ends.
"""

from __future__ import annotations

from agents import Agent, Runner, set_tracing_disabled
from agents.items import TResponseOutputItem
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0

# The SDK's own tracing exports to the OpenAI dashboard, which needs an API key: off. The guard's
# spans are OpenTelemetry's, and do not depend on it.
set_tracing_disabled(True)


def scripted(agent: str, tool: str) -> ScriptedModel:
    """A model that calls ``tool`` at the start of each run, then answers with what came back."""

    def respond(call: ModelCall) -> list[TResponseOutputItem]:
        global tool_calls
        last = call.input[-1] if isinstance(call.input, list) else {}
        if last.get("type") == "function_call_output":
            print(f"  {agent} got {tool}'s result: {str(last['output'])[:160]}")
            return [assistant_message(f"{agent}'s answer, from what {tool} said")]
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{agent} calls {tool} (tool call {tool_calls})")
            return [function_call(tool, {"input": f"asked by {agent}"}, call_id=f"call_{tool_calls}")]
        print(f"{agent}: the script gives up")
        return [assistant_message(f"{agent} gives up")]

    # ScriptedModel takes one step per model call. The loop makes at most 2 * MAX_TOOL_CALLS + 1 calls
    # in all (one per tool call, one answer per run), so that many steps never run out.
    return ScriptedModel([ModelStep.respond(respond) for _ in range(2 * MAX_TOOL_CALLS + 1)])


planner = Agent(name="planner", instructions="Plan the offsite.", model=scripted("planner", "ask_budget"))
budget = Agent(name="budget", instructions="Price the plan.", model=scripted("budget", "ask_planner"))
# Each agent is the other's tool: a call runs the other agent (Runner.run) and returns its final output.
planner.tools = [budget.as_tool(tool_name="ask_budget", tool_description="Ask the budget agent.")]
budget.tools = [planner.as_tool(tool_name="ask_planner", tool_description="Ask the planner agent.")]


def main() -> None:
    answer = Runner.run_sync(planner, "Plan the team offsite").final_output
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
