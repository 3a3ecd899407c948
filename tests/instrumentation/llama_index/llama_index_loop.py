"""Planner and budget, two LlamaIndex agents that ask each other through tools, on scripted models.

:class:`ScriptedModel` drives LlamaIndex's own offline function-calling model,
``llama_index.core.llms.MockFunctionCallingLLM``, through its ``response_generator``: it decides each
response from what it receives, as a real model reacts to its input:

- a fresh user turn (or a handoff that put this agent in charge): call the configured tool, while
  the shared :class:`CallBudget` lasts; after that, answer in text;
- a tool result (a refusal included): answer in text, naming what it read, so the model "reads" it.

:func:`build_loop` makes the agents-as-tools pattern of LlamaIndex's multi-agent docs: each agent's
``FunctionTool`` runs a fresh instance of the other agent (``await agent.run(...)``). Left alone,
planner and budget bounce until the budget of tool calls runs out; LlamaIndex's own limit (20
iterations per ``run()``) never meets a loop that starts a fresh run at every bounce.
:func:`build_handoffs` is the same two agents in one ``AgentWorkflow``, handing off to each other.
:class:`StepsModel` plays a script instead, one step a request (a tool call or an answer), as the
OpenAI Agents SDK's ``ScriptedModel`` does: the shape of a runtime's own example, step by step.

Run as a program (``opentelemetry-instrument python llama_index_loop.py``), it runs the planner once
and prints one line ``RESULT {json}`` of what happened; settings come from the environment.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, ToolCallBlock
from llama_index.core.llms import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool

_tool_call_ids = itertools.count(1)


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
    """What one model request received: the messages' roles and texts, and the tools offered."""

    messages: list[tuple[str, str]]
    tool_names: list[str]


class ScriptedModel:
    """An agent's model: calls ``tool`` on each new turn, answers from each tool result.

    ``tool="handoff"`` hands off to ``handoff_to`` (the tool ``AgentWorkflow`` gives its agents).
    """

    def __init__(
        self,
        me: str,
        tool: str | None,
        budget: CallBudget,
        *,
        parallel: int = 1,
        tool_input: dict[str, Any] | None = None,
        handoff_to: str | None = None,
        tokens: tuple[int, int] | None = None,
    ) -> None:
        self.me = me
        self.tool = tool
        self.budget = budget
        self.parallel = parallel
        self.tool_input = tool_input
        self.handoff_to = handoff_to
        self.tokens = tokens  # (input, output) reported per response, as a provider's raw usage
        self.requests: list[Request] = []
        self.tool_results: list[str] = []

    def llm(self) -> MockFunctionCallingLLM:
        """A fresh LlamaIndex model object answering with this script (reporting ``tokens``)."""
        if self.tokens is None:
            return MockFunctionCallingLLM(response_generator=self.respond)
        return ReportingLLM(response_generator=self.respond, usage=self.tokens)

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request ends with the user's text)."""
        return sum(1 for request in self.requests if request.messages[-1][0] == MessageRole.USER.value)

    def respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        tools = kwargs.get("tools") or ()
        self.requests.append(
            Request(
                [(message.role.value, message.content or "") for message in messages],
                [tool.metadata.get_name() for tool in tools],
            )
        )
        last = messages[-1]
        text = last.content or ""
        if last.role == MessageRole.TOOL and not text.startswith(f"Agent {self.me} is now handling"):
            self.tool_results.append(text)
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"{self.me} answers after: {text}")
        calls = [self.tool] * self.parallel if self.tool is not None else []
        calls = [name for name in calls if self.budget.take()]
        if not calls:
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"{self.me} answers without tools")
        blocks: list[Any] = [
            ToolCallBlock(
                tool_call_id=f"call_{next(_tool_call_ids)}", tool_name=name, tool_kwargs=self._input()
            )
            for name in calls
        ]
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)

    def _input(self) -> dict[str, Any]:
        if self.tool_input is not None:
            return self.tool_input
        if self.tool == "handoff":
            return {"to_agent": self.handoff_to, "reason": f"{self.me} needs {self.handoff_to}"}
        return {"question": f"from {self.me}"}


Step = str | tuple[str, dict[str, Any]]
"""One response of a :class:`StepsModel`: a call ``(tool, arguments)``, or an answer whose
``{result}`` is the text of the tool result it received."""


def call(tool: str, **arguments: Any) -> Step:
    return tool, arguments


class StepsModel:
    """An agent's model that plays ``steps``, one a request; a request past its script fails the run.
    ``tool_results`` are the tool results it read (a handoff's notice to the agent it put in charge
    included)."""

    def __init__(self, me: str, steps: Sequence[Step]) -> None:
        self.me = me
        self.steps = list(steps)
        self.tool_results: list[str] = []

    def llm(self) -> MockFunctionCallingLLM:
        return MockFunctionCallingLLM(response_generator=self.respond)

    def respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        last = messages[-1]
        result = ""
        if last.role == MessageRole.TOOL:
            result = last.content or ""
            self.tool_results.append(result)
        if not self.steps:
            raise AssertionError(f"{self.me}'s model was asked once more than its script says")
        step = self.steps.pop(0)
        if isinstance(step, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=step.format(result=result))
        name, arguments = step
        block = ToolCallBlock(
            tool_call_id=f"call_{next(_tool_call_ids)}", tool_name=name, tool_kwargs=arguments
        )
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=[block])


class ReportingLLM(MockFunctionCallingLLM):
    """``MockFunctionCallingLLM`` whose streamed responses carry a provider's usage in ``raw``, as
    OpenAI's do (``{"usage": {"prompt_tokens": ..., "completion_tokens": ...}}``)."""

    usage: tuple[int, int] = (0, 0)

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Any:
        responses = await super().astream_chat(messages, **kwargs)
        prompt, completion = self.usage
        raw = {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}

        async def reported() -> AsyncGenerator[ChatResponse, None]:
            async for response in responses:
                yield response.model_copy(update={"raw": raw})

        return reported()


@dataclass
class Loop:
    """Planner and budget: each agent's tool builds a fresh instance of the other and runs it."""

    planner_model: ScriptedModel
    budget_model: ScriptedModel
    calls: CallBudget
    tool_bodies: Counter[str] = field(default_factory=Counter)
    tools: dict[str, FunctionTool] = field(default_factory=dict)  # agent name -> its tool

    def planner(self) -> FunctionAgent:
        return agent("planner", self.planner_model, [self.tools["planner"]])

    def budget(self) -> FunctionAgent:
        return agent("budget", self.budget_model, [self.tools["budget"]])


def agent(name: str, model: ScriptedModel, tools: list[Any], **kwargs: Any) -> FunctionAgent:
    return FunctionAgent(
        name=name,
        description=f"The {name} agent.",
        system_prompt=f"You are {name}.",
        llm=model.llm(),
        tools=tools,
        **kwargs,
    )


def build_loop(
    *, planner_tool: str = "ask_budget", budget_tool: str = "ask_planner", max_tool_calls: int = 6
) -> Loop:
    """Planner and budget, each with a tool (named as given) that runs a fresh instance of the other."""
    calls = CallBudget(max_tool_calls)
    loop = Loop(
        ScriptedModel("planner", planner_tool, calls), ScriptedModel("budget", budget_tool, calls), calls
    )

    async def ask_budget(question: str) -> str:
        """Ask the budget agent what a plan costs."""
        loop.tool_bodies[planner_tool] += 1
        return str(await loop.budget().run(user_msg=question))

    async def ask_planner(question: str) -> str:
        """Ask the planner agent what the plan is."""
        loop.tool_bodies[budget_tool] += 1
        return str(await loop.planner().run(user_msg=question))

    loop.tools.update(
        planner=FunctionTool.from_defaults(async_fn=ask_budget, name=planner_tool),
        budget=FunctionTool.from_defaults(async_fn=ask_planner, name=budget_tool),
    )
    return loop


@dataclass
class Handoffs:
    """Planner and budget in one ``AgentWorkflow``, each able to hand off to the other."""

    workflow: AgentWorkflow
    planner_model: ScriptedModel
    budget_model: ScriptedModel
    calls: CallBudget


def build_handoffs(*, max_tool_calls: int = 6) -> Handoffs:
    calls = CallBudget(max_tool_calls)
    planner_model = ScriptedModel("planner", "handoff", calls, handoff_to="budget")
    budget_model = ScriptedModel("budget", "handoff", calls, handoff_to="planner")
    workflow = AgentWorkflow(
        agents=[
            agent("planner", planner_model, [], can_handoff_to=["budget"]),
            agent("budget", budget_model, [], can_handoff_to=["planner"]),
        ],
        root_agent="planner",
    )
    return Handoffs(workflow, planner_model, budget_model, calls)


async def run_loop() -> dict[str, Any]:
    loop = build_loop()
    output = await loop.planner().run(user_msg="Plan the team offsite")
    return {
        "output": str(output),
        "planner_runs": loop.planner_model.runs,
        "budget_runs": loop.budget_model.runs,
        "tool_calls": loop.calls.made,
        "tool_bodies": dict(loop.tool_bodies),
        "budget_saw": loop.budget_model.tool_results,
    }


async def run_handoffs() -> dict[str, Any]:
    handoffs = build_handoffs()
    output = await handoffs.workflow.run(user_msg="Plan the team offsite")
    return {
        "output": str(output),
        "handoffs": handoffs.calls.made,
        "budget_saw": handoffs.budget_model.tool_results,
    }


def main() -> None:
    report = asyncio.run(run_handoffs() if sys.argv[1:] == ["handoffs"] else run_loop())
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
