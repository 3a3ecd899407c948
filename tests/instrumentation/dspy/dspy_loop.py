"""Planner and budget, two ``dspy.ReAct`` agents that ask each other, on scripted DSPy models.

:class:`ScriptedLM` is DSPy's own ``DummyLM`` (dspy.utils.dummies) whose answers are decided from
what each request carries, as a real model reacts to its input (DummyLM's lists and dicts cannot read
a ReAct trajectory):

- ReAct's step with nothing observed yet: call the configured tool, while the shared
  :class:`CallBudget` lasts; after that, ``finish``;
- ReAct's step after an observation (a tool's result or its error: a refusal included): ``finish``;
- ReAct's extract step: the answer, quoting the last observation, so the model "reads" it.

Each response reports ``tokens`` of usage (DummyLM's own reports none), so the token budget has
something to count. :func:`build_loop` makes the loop through tool functions that build a fresh agent
and run it; ``as_tools=True`` gives each agent the other module itself as its tool
(``dspy.Tool(module)``). Left alone, planner and budget bounce until the budget of calls runs out.

Run as a program (``opentelemetry-instrument python dspy_loop.py``), it runs the planner once and
prints one line ``RESULT {json}`` of what happened; settings come from the environment.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import dspy
from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.dummies import DummyLM

_OBSERVATION = re.compile(r"\[\[ ## observation_0 ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with |\Z)", re.S)
"""The first observation of a ReAct trajectory, as DSPy's chat adapter formats it in the user turn."""


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


class _ScriptedEngine(DummyEngine):  # type: ignore[misc]
    def _complete_messages(self, messages: list[dict[str, Any]]) -> Any:
        owner: ScriptedLM = self.owner
        text = owner.decide(messages)
        half = owner.tokens // 2
        usage = Usage(input_tokens=half, output_tokens=owner.tokens - half, total_tokens=owner.tokens)
        return Response(
            id=None,
            model="dummy",
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=usage,
        )


class ScriptedLM(DummyLM):  # type: ignore[misc]
    """A ``DummyLM`` for one ReAct agent: call ``tool`` with ``question`` while ``calls`` lasts."""

    def __init__(self, agent: str, tool: str | None, calls: CallBudget, tokens: int = 10) -> None:
        super().__init__([])
        self.agent = agent
        self.tool = tool
        self.calls = calls
        self.tokens = tokens
        self.requests = 0
        self.observations: list[str] = []  # what each of its steps after a tool call read
        self.user_turns: list[str] = []
        self._engine_spec = _ScriptedEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    def decide(self, messages: list[dict[str, Any]]) -> str:
        self.requests += 1
        system, last = messages[0]["content"], messages[-1]["content"]
        self.user_turns.append(last)
        seen = _OBSERVATION.search(last)
        observed = seen.group(1).strip() if seen else None
        if "next_tool_name" in system:  # ReAct's step
            if observed is None and self.tool is not None and self.calls.take():
                fields = {
                    "next_thought": f"ask {self.tool}",
                    "next_tool_name": self.tool,
                    "next_tool_args": {"question": f"{self.agent} asks"},
                }
            else:
                if observed is not None:
                    self.observations.append(observed)
                fields = {"next_thought": "done", "next_tool_name": "finish", "next_tool_args": {}}
        else:  # the extract step
            fields = {"reasoning": "read it", "answer": f"{self.agent} answers after {observed or 'nothing'}"}
        return str(self._format_answer_fields(fields))


def react(name: str, lm: ScriptedLM, tools: list[Any]) -> dspy.ReAct:
    """A named ``dspy.ReAct`` agent on its own model."""
    agent = dspy.ReAct("question -> answer", tools=tools)
    agent.name = name
    agent.set_lm(lm)
    return agent


@dataclass
class Loop:
    """The two agents' models, and what ran: each agent is built fresh for every call."""

    calls: CallBudget
    planner_lm: ScriptedLM
    budget_lm: ScriptedLM
    as_tools: bool = False
    tool_bodies: Counter[str] = field(default_factory=Counter)

    def planner(self) -> dspy.ReAct:
        if self.as_tools:
            return self._modules_as_tools()
        return react("planner", self.planner_lm, [self._tool("budget")])

    def budget(self) -> dspy.ReAct:
        return react("budget", self.budget_lm, [self._tool("planner")])

    def _modules_as_tools(self) -> dspy.ReAct:
        """Planner and budget, each the other's tool: ``dspy.Tool(module)``, one instance each."""
        args = {"question": {"type": "string"}}
        planner = react(
            "planner", self.planner_lm, [dspy.Tool(lambda question: "", name="budget", args=args)]
        )
        budget = react("budget", self.budget_lm, [dspy.Tool(planner, name="planner", args=args)])
        planner.tools["budget"].func = budget
        planner.tools["budget"].desc = budget.tools["planner"].desc = "Ask the other agent."
        return planner

    def _tool(self, callee: str) -> Any:
        build = self.budget if callee == "budget" else self.planner

        def ask(question: str) -> str:
            self.tool_bodies[f"ask_{callee}"] += 1
            return str(build()(question=question).answer)

        ask.__name__ = f"ask_{callee}"
        ask.__doc__ = f"Ask the {callee}."
        return ask


def build_loop(calls: int = 6, *, as_tools: bool = False, tokens: int = 10) -> Loop:
    budget = CallBudget(calls)
    planner_tool = "budget" if as_tools else "ask_budget"
    budget_tool = "planner" if as_tools else "ask_planner"
    return Loop(
        budget,
        ScriptedLM("planner", planner_tool, budget, tokens),
        ScriptedLM("budget", budget_tool, budget, tokens),
        as_tools,
    )


def main() -> None:
    loop = build_loop()
    try:
        answer: str | None = str(loop.planner()(question="Plan the team offsite").answer)
        error = None
    except Exception as exc:
        answer, error = None, f"{type(exc).__name__}: {exc}"
    print(
        "RESULT "
        + json.dumps(
            {
                "answer": answer,
                "error": error,
                "calls": loop.calls.made,
                "planner_requests": loop.planner_lm.requests,
                "budget_requests": loop.budget_lm.requests,
                "tool_bodies": dict(loop.tool_bodies),
            }
        )
    )


if __name__ == "__main__":
    main()
