"""Planner and budget, two Haystack Agents that ask each other, on a scripted chat generator.

:class:`ScriptedChatGenerator` is a real Haystack ``@component`` with ``run(messages, tools)``
returning scripted ``ChatMessage``s, as the chat generators Haystack's own tests fake. It decides
each reply from what it receives, as a real model reacts to its input:

- a fresh task (the last message is the user's): call the configured tool, while the shared
  :class:`CallBudget` lasts; after that, answer in text;
- a tool result (a refusal included, Haystack's error result): answer in text, quoting it.

Each reply reports ``meta["usage"]`` (10 prompt and 5 completion tokens, as OpenAI's generators).

:func:`agent_loop` makes Haystack's agents-as-tools pattern: each Agent has the other as an
``AgentTool`` (a chain of fresh instances, planner, budget, planner, ...), and the top one runs in a
``Pipeline`` under the name ``planner``. :func:`function_loop` makes the other common pattern: each
Agent's tool is a function ``Tool`` whose body runs a fresh Agent of the other.

Run as a program (``opentelemetry-instrument python haystack_loop.py``), it runs the loop once and
prints one line ``RESULT {json}`` of what happened; settings come from the environment.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from haystack import Pipeline, component
from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.tools import AgentTool, Tool

_call_ids = itertools.count(1)


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


def task(text: str) -> dict[str, Any]:
    """An AgentTool's arguments: the task as its one user message."""
    return {"messages": [{"role": "user", "content": text}]}


@component
class ScriptedChatGenerator:
    """An agent's model: calls ``tool`` on each new task, answers from each tool result."""

    def __init__(
        self,
        me: str,
        tool: str | None,
        budget: CallBudget,
        *,
        arguments: dict[str, Any] | None = None,
        parallel: int = 1,
    ) -> None:
        self.me = me
        self.tool = tool
        self.budget = budget
        self.arguments = arguments
        self.parallel = parallel
        self.requests: list[list[tuple[str, str]]] = []
        self.tool_results: list[str] = []

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request ends with the user's task)."""
        return sum(1 for request in self.requests if request[-1][0] == "user")

    @component.output_types(replies=list[ChatMessage])
    def run(self, messages: list[ChatMessage], tools: Any = None, **kwargs: Any) -> dict[str, Any]:
        seen = [(message.role.value, _text_of(message)) for message in messages]
        self.requests.append(seen)
        last = messages[-1]
        if last.is_from(ChatRole.TOOL):
            text = _text_of(last)
            self.tool_results.append(text)
            return self._reply(text=f"{self.me} answers after {text}")
        calls = [self.tool] * self.parallel if self.tool is not None else []
        calls = [name for name in calls if self.budget.take()]
        if not calls:
            return self._reply(text=f"{self.me} answers without tools")
        arguments = self.arguments or task(f"asked by {self.me}")
        return self._reply(
            tool_calls=[ToolCall(name, arguments, id=f"call_{next(_call_ids)}") for name in calls]
        )

    def _reply(self, *, text: str | None = None, tool_calls: list[ToolCall] | None = None) -> dict[str, Any]:
        meta = {"usage": {"prompt_tokens": 10, "completion_tokens": 5}, "model": f"scripted-{self.me}"}
        return {"replies": [ChatMessage.from_assistant(text, meta=meta, tool_calls=tool_calls)]}


def _text_of(message: ChatMessage) -> str:
    if message.tool_call_result is not None:
        return str(message.tool_call_result.result)
    return message.text or ""


@dataclass
class Loop:
    """Planner and budget agents: ``top`` is the planner the loop starts from."""

    top: Agent
    models: list[ScriptedChatGenerator]
    calls: CallBudget
    tool_bodies: Counter[str] = field(default_factory=Counter)

    def models_of(self, name: str) -> list[ScriptedChatGenerator]:
        return [model for model in self.models if model.me == name]

    def runs(self, name: str) -> int:
        return sum(model.runs for model in self.models_of(name))

    def tool_results(self, name: str) -> list[str]:
        return [text for model in self.models_of(name) for text in model.tool_results]

    def run(self, question: str = "Plan the team offsite", *, pipeline: bool = True) -> dict[str, Any]:
        """Run the top planner (in a pipeline, as ``planner``, or directly); its result."""
        messages = [ChatMessage.from_user(question)]
        if not pipeline:
            return self.top.run(messages=messages)
        pipe = Pipeline()
        pipe.add_component("planner", self.top)
        return pipe.run({"planner": {"messages": messages}})["planner"]  # type: ignore[no-any-return]

    async def run_async(self, question: str = "Plan the team offsite") -> dict[str, Any]:
        return await self.top.run_async(messages=[ChatMessage.from_user(question)])


def _other(name: str) -> str:
    return "budget" if name == "planner" else "planner"


def agent_loop(*, depth: int = 8, max_tool_calls: int = 6) -> Loop:
    """``depth`` Agents, alternately planner and budget, each with the next as an ``AgentTool``
    named after it; the last has no tool."""
    calls = CallBudget(max_tool_calls)
    models: list[ScriptedChatGenerator] = []
    below: list[Any] = []
    for n in reversed(range(depth)):
        me = "planner" if n % 2 == 0 else "budget"
        model = ScriptedChatGenerator(me, _other(me) if below else None, calls)
        models.insert(0, model)
        agent = Agent(chat_generator=model, tools=below)
        below = [AgentTool(agent, name=me, description=f"Ask the {me} agent.")]
    top = below[0]._component
    return Loop(top, models, calls)


def function_loop(*, max_tool_calls: int = 6) -> Loop:
    """Planner and budget, each with a function tool (``ask_budget``, ``ask_planner``) that builds a
    fresh Agent of the other and runs it."""
    calls = CallBudget(max_tool_calls)
    models: list[ScriptedChatGenerator] = []
    loop: Loop

    def make(me: str) -> Agent:
        other = _other(me)
        model = ScriptedChatGenerator(me, f"ask_{other}", calls, arguments={"question": f"from {me}"})
        models.append(model)
        return Agent(chat_generator=model, tools=[ask(other)])

    def ask(other: str) -> Tool:
        def body(question: str) -> str:
            loop.tool_bodies[f"ask_{other}"] += 1
            result = make(other).run(messages=[ChatMessage.from_user(question)])
            return str(result["last_message"].text)

        schema = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}
        return Tool(
            name=f"ask_{other}", description=f"Ask the {other} agent.", parameters=schema, function=body
        )

    loop = Loop(make("planner"), models, calls)
    return loop


def main() -> None:
    loop = agent_loop()
    result = loop.run()
    report = {
        "output": result["last_message"].text,
        "exit_reason": result["exit_reason"],
        "planner_runs": loop.runs("planner"),
        "budget_runs": loop.runs("budget"),
        "tool_calls": loop.calls.made,
        "budget_saw": loop.tool_results("budget"),
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
