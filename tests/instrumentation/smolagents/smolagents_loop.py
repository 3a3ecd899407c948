"""Planner and budget, two smolagents agents that ask each other, on scripted models.

:class:`ScriptedModel` is a subclass of smolagents' own ``Model`` that overrides ``generate``, as
smolagents' test suite's fake models do. It decides each response from what it receives, as a real
model reacts to its input:

- a fresh task (the last message is the user's): call the configured tool or managed agent, while
  the shared :class:`CallBudget` lasts; after that, give the final answer (smolagents' ``final_answer``
  tool call);
- a tool response (an observation, or a step's error: a refusal included): give the final answer,
  quoting what came back, so the model "reads" it and answers.

:func:`build_loop` makes the "agents as tools" pattern: each tool builds a fresh agent and runs it.
:func:`managed_loop` makes smolagents' own multi-agent pattern: each agent is the other's managed
agent (``managed_agents``), a chain of fresh instances. Left alone, planner and budget bounce until
the budget of tool calls runs out.

Run as a program (``opentelemetry-instrument python smolagents_loop.py``), it runs the planner once and
prints one line ``RESULT {json}`` of what happened; settings come from the environment.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from smolagents import CodeAgent, LogLevel, Model, Tool, ToolCallingAgent
from smolagents.models import (
    ChatMessage,
    ChatMessageStreamDelta,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    ChatMessageToolCallStreamDelta,
    MessageRole,
)
from smolagents.monitoring import TokenUsage

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


@dataclass
class Request:
    """What one model request received: (role, text) of each message, and the tools offered."""

    messages: list[tuple[str, str]]
    tool_names: list[str]


def text_of(message: Any) -> str:
    """The text of a smolagents chat message (a string, or a list of content blocks)."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or () if isinstance(block, dict))


class ScriptedModel(Model):
    """An agent's model: calls ``tool`` on each new task, answers from each tool response.

    ``arguments`` are the call's (``{"question": ...}`` for a tool, ``{"task": ...}`` for a managed
    agent); ``parallel`` calls of it per response; ``code=True`` writes the call as a CodeAgent's
    code instead (``result = tool(...)``, then ``final_answer(...)``).
    """

    def __init__(
        self,
        me: str,
        tool: str | None,
        budget: CallBudget,
        *,
        arguments: dict[str, Any] | None = None,
        parallel: int = 1,
        tokens: tuple[int, int] = (10, 5),
        code: bool = False,
    ) -> None:
        super().__init__(model_id=f"scripted-{me}")
        self.me = me
        self.tool = tool
        self.budget = budget
        self.arguments = arguments
        self.parallel = parallel
        self.tokens = tokens
        self.code = code
        self.requests: list[Request] = []
        self.tool_responses: list[str] = []

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request ends with the user's task)."""
        return sum(1 for request in self.requests if request.messages[-1][0] == MessageRole.USER)

    def generate(
        self,
        messages: list[Any],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        seen = [(MessageRole(message.role).value, text_of(message)) for message in messages]
        self.requests.append(Request(seen, [tool.name for tool in tools_to_call_from or ()]))
        role, text = seen[-1]
        if role == MessageRole.TOOL_RESPONSE:
            self.tool_responses.append(text)
            return self._answer(f"{self.me} answers after {text}")
        calls = [self.tool] * self.parallel if self.tool is not None else []
        calls = [name for name in calls if self.budget.take()]
        if not calls:
            return self._answer(f"{self.me} answers without tools")
        arguments = self.arguments or {"question": f"from {self.me}"}
        if self.code:
            lines = [
                f"result_{n} = {name}(**{arguments!r})\nprint(result_{n})" for n, name in enumerate(calls)
            ]
            return self._message(content="<code>\n" + "\n".join(lines) + "\n</code>")
        return self._message(tool_calls=[_tool_call(name, arguments) for name in calls])

    def _answer(self, text: str) -> ChatMessage:
        if self.code:
            return self._message(content=f"<code>\nfinal_answer({text!r})\n</code>")
        return self._message(tool_calls=[_tool_call("final_answer", {"answer": text})])

    def _message(
        self, *, content: str = "", tool_calls: list[ChatMessageToolCall] | None = None
    ) -> ChatMessage:
        usage = TokenUsage(input_tokens=self.tokens[0], output_tokens=self.tokens[1])
        return ChatMessage(
            role=MessageRole.ASSISTANT, content=content, tool_calls=tool_calls, token_usage=usage
        )


class StreamingScriptedModel(ScriptedModel):
    """:class:`ScriptedModel` answering through ``generate_stream`` too: one delta per response."""

    def generate_stream(self, messages: list[Any], **kwargs: Any) -> Iterator[ChatMessageStreamDelta]:
        message = self.generate(messages, **kwargs)
        calls = [
            ChatMessageToolCallStreamDelta(
                index=n,
                id=call.id,
                type=call.type,
                function=ChatMessageToolCallFunction(
                    name=call.function.name, arguments=json.dumps(call.function.arguments)
                ),
            )
            for n, call in enumerate(message.tool_calls or ())
        ]
        yield ChatMessageStreamDelta(
            content=text_of(message), tool_calls=calls, token_usage=message.token_usage
        )


def _tool_call(name: str, arguments: dict[str, Any]) -> ChatMessageToolCall:
    function = ChatMessageToolCallFunction(name=name, arguments=arguments)
    return ChatMessageToolCall(id=f"call_{next(_call_ids)}", type="function", function=function)


class Ask(Tool):
    """A tool that asks a question of whatever ``ask`` runs (another agent, in the loops here)."""

    inputs = {"question": {"type": "string", "description": "What to ask."}}  # noqa: RUF012  # smolagents reads it
    output_type = "string"

    def __init__(self, name: str, description: str, ask: Callable[[str], Any]) -> None:
        self.name = name
        self.description = description
        self.ask = ask
        super().__init__()

    def forward(self, question: str) -> str:
        return str(self.ask(question))


def agent(
    name: str,
    model: Model,
    tools: list[Any] | None = None,
    managed: list[Any] | None = None,
    *,
    code: bool = False,
    **options: Any,
) -> Any:
    """A quiet agent (smolagents prints every step at its default verbosity)."""
    kind = CodeAgent if code else ToolCallingAgent
    return kind(
        **options,
        tools=tools or [],
        model=model,
        name=name,
        description=f"The {name} agent.",
        managed_agents=managed,
        verbosity_level=LogLevel.OFF,
    )


@dataclass
class Loop:
    """Planner and budget: each agent's tool builds a fresh instance of the other and runs it."""

    planner_model: ScriptedModel
    budget_model: ScriptedModel
    calls: CallBudget
    tool_bodies: Counter[str] = field(default_factory=Counter)
    tools: dict[str, Tool] = field(default_factory=dict)  # agent name -> its tool

    def planner(self) -> ToolCallingAgent:
        return self._agent("planner", self.planner_model)

    def budget(self) -> ToolCallingAgent:
        return self._agent("budget", self.budget_model)

    def _agent(self, name: str, model: ScriptedModel) -> ToolCallingAgent:
        streams = isinstance(model, StreamingScriptedModel)
        return agent(name, model, [self.tools[name]], stream_outputs=streams)  # type: ignore[no-any-return]


def build_loop(
    *,
    planner_tool: str = "ask_budget",
    budget_tool: str = "ask_planner",
    max_tool_calls: int = 6,
    model: type[ScriptedModel] = ScriptedModel,
) -> Loop:
    """Planner and budget, each with a tool (named as given) that runs a fresh instance of the other."""
    calls = CallBudget(max_tool_calls)
    loop = Loop(model("planner", planner_tool, calls), model("budget", budget_tool, calls), calls)

    def ask_budget(question: str) -> Any:
        loop.tool_bodies[planner_tool] += 1
        return loop.budget().run(question)

    def ask_planner(question: str) -> Any:
        loop.tool_bodies[budget_tool] += 1
        return loop.planner().run(question)

    loop.tools["planner"] = Ask(planner_tool, "Ask the budget agent what a plan costs.", ask_budget)
    loop.tools["budget"] = Ask(budget_tool, "Ask the planner agent what the plan is.", ask_planner)
    return loop


@dataclass
class ManagedLoop:
    """Planner and budget as each other's managed agents: ``planner`` is the first of a chain of
    fresh instances, each managing the next (planner, budget, planner, ...)."""

    planner: Any
    models: list[ScriptedModel]
    calls: CallBudget

    def models_of(self, name: str) -> list[ScriptedModel]:
        return [model for model in self.models if model.me == name]


def managed_loop(*, depth: int = 8, max_tool_calls: int = 6, code: bool = False) -> ManagedLoop:
    """``depth`` agents, alternately planner and budget, each managing the next; the last manages none."""
    calls = CallBudget(max_tool_calls)
    names = ["planner" if n % 2 == 0 else "budget" for n in range(depth)]
    models: list[ScriptedModel] = []
    managed: list[Any] = []
    for n in reversed(range(depth)):
        me, other = names[n], ("budget" if names[n] == "planner" else "planner")
        model = ScriptedModel(
            me, other if managed else None, calls, arguments={"task": f"asked by {me}"}, code=code
        )
        models.insert(0, model)
        managed = [agent(me, model, managed=managed, code=code)]
    return ManagedLoop(managed[0], models, calls)


def main() -> None:
    loop = build_loop()
    output = loop.planner().run("Plan the team offsite")
    report = {
        "output": str(output),
        "planner_runs": loop.planner_model.runs,
        "budget_runs": loop.budget_model.runs,
        "tool_calls": loop.calls.made,
        "tool_bodies": dict(loop.tool_bodies),
        "budget_saw": loop.budget_model.tool_responses,
    }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
