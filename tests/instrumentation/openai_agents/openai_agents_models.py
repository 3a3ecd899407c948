"""Offline models for the OpenAI Agents SDK tests: no API key, no network.

:class:`LoopModel` is the SDK's own test double (``agents.testing.ScriptedModel``) given one scripted
step per call, decided from what the model receives -- the way a real model reacts to its input:

- a fresh user turn (or the message that a handoff made this agent the one in charge): call the
  configured tool, while the shared :class:`CallBudget` lasts; after that, answer directly;
- a tool's output: answer with it (a refusal included: the model "reads" it and answers).

So two agents that call each other loop until the budget runs out, unless a guard stops them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent
from agents.models.interface import Model
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

_call_ids = itertools.count(1)


class CallBudget:
    """How many tool calls all the models of one test may still make (so every loop ends)."""

    def __init__(self, calls: int) -> None:
        self.left = calls
        self.made = 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.made += 1
        return True


class LoopModel(Model):
    """An agent's model: calls ``tool`` on each new turn, answers from each tool output."""

    def __init__(self, me: str, tool: str | None, budget: CallBudget) -> None:
        self.me = me
        self.tool = tool
        self.budget = budget
        self.calls: list[ModelCall] = []

    def _respond(self, call: ModelCall) -> Any:
        items = call.input if isinstance(call.input, list) else [{"role": "user", "content": call.input}]
        last = items[-1]
        if last.get("type") == "function_call_output" and not _hands_over_to(last, self.me):
            return [assistant_message(f"{self.me} answers: {_text(last['output'])}")]
        if self.tool is None or not self.budget.take():
            return [assistant_message(f"{self.me} answers on its own")]
        arguments = {"input": f"question from {self.me}"}
        return [function_call(self.tool, arguments, call_id=f"call_{next(_call_ids)}")]

    def _scripted(self) -> ScriptedModel:
        return ScriptedModel([ModelStep.respond(self._respond)])

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        scripted = self._scripted()
        try:
            return await scripted.get_response(*args, **kwargs)
        finally:
            self.calls.extend(scripted.calls)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        scripted = self._scripted()
        try:
            async for event in scripted.stream_response(*args, **kwargs):
                yield event
        finally:
            self.calls.extend(scripted.calls)

    def user_turns(self) -> list[str]:
        """The first user message of every call this model received."""
        return [_first_user_text(call.input) for call in self.calls]


def _hands_over_to(item: dict[str, Any], agent: str) -> bool:
    """Whether a tool output is the SDK's handoff message making ``agent`` the one in charge."""
    try:
        return json.loads(item["output"]) == {"assistant": agent}
    except (TypeError, ValueError):
        return False


def _text(output: Any) -> str:
    """A tool output as text (an MCP tool's output is a list of content parts)."""
    if isinstance(output, list):
        return "".join(part.get("text", "") for part in output)
    return str(output)


def _first_user_text(model_input: Any) -> str:
    if isinstance(model_input, str):
        return model_input
    for item in model_input:
        if item.get("role") == "user":
            content = item["content"]
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content)
    return ""


def agents_as_tools_of_each_other(budget: CallBudget) -> tuple[Agent[Any], Agent[Any]]:
    """planner and budget, each the other's tool (``Agent.as_tool``): planner -> budget -> ..."""
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget_agent = Agent(name="budget", instructions="Price the plan.")
    planner.model = LoopModel("planner", "budget", budget)
    budget_agent.model = LoopModel("budget", "planner", budget)
    planner.tools = [budget_agent.as_tool("budget", "Ask the budget agent.")]
    budget_agent.tools = [planner.as_tool("planner", "Ask the planner agent.")]
    return planner, budget_agent


def agents_handing_off_to_each_other(budget: CallBudget) -> tuple[Agent[Any], Agent[Any]]:
    """planner and budget, each with a handoff to the other: planner -> budget -> planner ..."""
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget_agent = Agent(name="budget", instructions="Price the plan.")
    planner.model = LoopModel("planner", "transfer_to_budget", budget)
    budget_agent.model = LoopModel("budget", "transfer_to_planner", budget)
    planner.handoffs = [budget_agent]
    budget_agent.handoffs = [planner]
    return planner, budget_agent
