"""Planner and budget, two Strands agents that ask each other through tools, on scripted models.

:class:`ScriptedModel` is a small subclass of Strands' own model base class (``strands.models.Model``),
streamed the way Strands' test suite streams its ``MockedModelProvider``: it decides each response
from what it receives, as a real model reacts to its input:

- a fresh user turn: call the configured tool, while the shared :class:`CallBudget` lasts; after
  that, answer in text;
- a tool result (a refusal included): answer in text, naming the result's status, so the model
  "reads" it and answers.

:func:`build_loop` makes the Strands "agents as tools" pattern: each tool builds a fresh agent and
runs it (a Strands agent refuses to be re-entered while it runs, so a loop between agents is a loop
of fresh instances). Left alone, planner and budget bounce until the budget of tool calls runs out.

Run as a program (``opentelemetry-instrument python strands_loop.py``), it runs the planner once and
prints one line ``RESULT {json}`` of what happened; settings come from the environment.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
from collections import Counter
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from typing import Any

from strands import Agent, tool
from strands.models import Model

_tool_use_ids = itertools.count(1)


class CallBudget:
    """How many tool calls all the models of one loop may still make (so every loop ends)."""

    def __init__(self, calls: int) -> None:
        self.left = calls
        self.made = 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.made += 1
        return True


@dataclass
class Request:
    """What one model request received."""

    messages: list[dict[str, Any]]
    system_prompt: str | None
    tool_names: list[str]


class ScriptedModel(Model):
    """An agent's model: calls ``tool`` on each new turn, answers from each tool result."""

    def __init__(
        self,
        me: str,
        tool: str | None,
        budget: CallBudget,
        *,
        tokens: tuple[int, int] = (10, 5),
        parallel: int = 1,
        tool_input: dict[str, Any] | None = None,
    ) -> None:
        self.me = me
        self.tool = tool
        self.budget = budget
        self.tokens = tokens  # (input, output) reported per response
        self.parallel = parallel  # tool calls per response
        self.tool_input = tool_input
        self.requests: list[Request] = []
        self.tool_results: list[dict[str, Any]] = []

    # The configuration Strands' Model asks for; nothing to configure offline.
    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> dict[str, Any]:
        return {"model_id": f"scripted-{self.me}"}

    def structured_output(
        self, output_model: Any, prompt: Any, system_prompt: str | None = None, **kwargs: Any
    ) -> Any:
        raise NotImplementedError("the scripted model answers in text")

    async def stream(
        self,
        messages: Any,
        tool_specs: Any = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncGenerator[dict[str, Any], None]:
        self.requests.append(
            Request(copy.deepcopy(messages), system_prompt, [spec["name"] for spec in tool_specs or ()])
        )
        for event in self._respond(messages):
            yield event

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request ends with the user's text)."""
        return sum(1 for request in self.requests if not tool_results_of(request.messages[-1]))

    def _respond(self, messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        returned = tool_results_of(messages[-1])
        if returned:
            self.tool_results.extend(returned)
            seen = "; ".join(f"{result['status']}: {_text(result)}" for result in returned)
            return _text_response(f"{self.me} answers after {seen}", self.tokens)
        calls = [self.tool] * self.parallel if self.tool is not None else []
        calls = [name for name in calls if self.budget.take()]
        if not calls:
            return _text_response(f"{self.me} answers without tools", self.tokens)
        arguments = self.tool_input or {"question": f"from {self.me}"}
        return _tool_use_response(calls, arguments, self.tokens)


def tool_results_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool results a message carries (a model request whose newest message has some answers them)."""
    return [block["toolResult"] for block in message.get("content", []) if "toolResult" in block]


def _text(result: dict[str, Any]) -> str:
    return " ".join(block.get("text", "") for block in result.get("content", []))


def _usage(tokens: tuple[int, int]) -> dict[str, Any]:
    prompt, completion = tokens
    usage = {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}
    return {"metadata": {"usage": usage, "metrics": {"latencyMs": 1}}}


def _text_response(text: str, tokens: tuple[int, int]) -> Iterator[dict[str, Any]]:
    yield {"messageStart": {"role": "assistant"}}
    yield {"contentBlockStart": {"start": {}}}
    yield {"contentBlockDelta": {"delta": {"text": text}}}
    yield {"contentBlockStop": {}}
    yield {"messageStop": {"stopReason": "end_turn"}}
    yield _usage(tokens)


def _tool_use_response(
    names: list[str], arguments: dict[str, Any], tokens: tuple[int, int]
) -> Iterator[dict[str, Any]]:
    yield {"messageStart": {"role": "assistant"}}
    for name in names:
        start = {"toolUse": {"name": name, "toolUseId": f"tooluse_{next(_tool_use_ids)}"}}
        yield {"contentBlockStart": {"start": start}}
        yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments)}}}}
        yield {"contentBlockStop": {}}
    yield {"messageStop": {"stopReason": "tool_use"}}
    yield _usage(tokens)


@dataclass
class Loop:
    """Planner and budget: each agent's tool builds a fresh instance of the other and runs it."""

    planner_model: ScriptedModel
    budget_model: ScriptedModel
    calls: CallBudget
    tool_bodies: Counter[str] = field(default_factory=Counter)
    tools: dict[str, Any] = field(default_factory=dict)  # agent name -> its tool

    def planner(self) -> Agent:
        return _agent("planner", self.planner_model, [self.tools["planner"]])

    def budget(self) -> Agent:
        return _agent("budget", self.budget_model, [self.tools["budget"]])


def _agent(name: str, model: Model, tools: list[Any]) -> Agent:
    # No callback handler: Strands' default one prints every streamed token to stdout.
    return Agent(name=name, model=model, tools=tools, callback_handler=None, system_prompt=f"You are {name}.")


def build_loop(
    *, planner_tool: str = "ask_budget", budget_tool: str = "ask_planner", max_tool_calls: int = 6
) -> Loop:
    """Planner and budget, each with a tool (named as given) that runs a fresh instance of the other."""
    calls = CallBudget(max_tool_calls)
    loop = Loop(
        ScriptedModel("planner", planner_tool, calls), ScriptedModel("budget", budget_tool, calls), calls
    )

    @tool(name=planner_tool)
    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        loop.tool_bodies[planner_tool] += 1
        return str(await loop.budget().invoke_async(question)).strip()

    @tool(name=budget_tool)
    async def ask_planner(question: str) -> str:
        """Ask the planner agent what the plan is."""
        loop.tool_bodies[budget_tool] += 1
        return str(await loop.planner().invoke_async(question)).strip()

    loop.tools.update(planner=ask_budget, budget=ask_planner)
    return loop


def main() -> None:
    loop = build_loop()
    result = asyncio.run(loop.planner().invoke_async("Plan the team offsite"))
    report = {
        "output": str(result).strip(),
        "planner_runs": loop.planner_model.runs,
        "budget_runs": loop.budget_model.runs,
        "tool_calls": loop.calls.made,
        "tool_bodies": dict(loop.tool_bodies),
        "budget_saw": [[r["status"], _text(r)] for r in loop.budget_model.tool_results],
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
