"""Planner and budget, two Agno agents (or a team and its member) that ask each other, on scripted models.

:class:`ScriptedModel` is a subclass of Agno's own ``agno.models.base.Model`` that overrides
``invoke`` (and its async and streaming forms), as Agno's offline tests do. It decides each response
from what it receives, as a real model reacts to its input:

- a fresh turn (the last message is not a tool's result): call the configured tool with the
  configured arguments, while the shared :class:`CallBudget` lasts;
- a tool's result (a refusal included), or no budget left: answer in text, quoting the result, so
  the model "reads" it.

Each response reports ``tokens`` of usage in Agno's ``Metrics``. :func:`build_loop` makes the loop
through tool functions that build a fresh agent and run it; :func:`team_loop` makes a team whose
leader delegates to a member agent whose tool runs the team again.

Run as a program (``opentelemetry-instrument python agno_loop.py``), it runs the planner once and
prints one line ``RESULT {json}`` of what happened; settings come from the environment.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("AGNO_TELEMETRY", "false")  # no analytics calls to Agno's servers

from agno.agent import Agent
from agno.metrics import MessageMetrics
from agno.models.base import Model
from agno.models.message import Message
from agno.models.response import ModelResponse
from agno.team import Team


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
class ScriptedModel(Model):
    """An offline Agno model: on a fresh turn it calls ``tool`` with ``arguments`` while ``calls``
    lasts; on a tool's result, or with none left, it answers in text, quoting what it read."""

    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    calls: CallBudget = field(default_factory=lambda: CallBudget(0))
    tokens: int = 10
    requests: int = 0
    tool_results: list[str] = field(default_factory=list)
    user_turns: list[str] = field(default_factory=list)

    def invoke(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> ModelResponse:
        self.requests += 1
        last = messages[-1]
        half = self.tokens // 2
        usage = MessageMetrics(input_tokens=half, output_tokens=self.tokens - half, total_tokens=self.tokens)
        if last.role != "tool":
            self.user_turns.append(str(last.content))
            if self.tool and self.calls.take():
                call = {"name": self.tool, "arguments": json.dumps(self.arguments)}
                made = {"id": f"call_{self.calls.made}", "type": "function", "function": call}
                return ModelResponse(role="assistant", tool_calls=[made], response_usage=usage)
            return ModelResponse(role="assistant", content=f"{self.name} answers", response_usage=usage)
        read = str(last.content)
        self.tool_results.append(read)
        return ModelResponse(
            role="assistant", content=f"{self.name} answers after {read}", response_usage=usage
        )

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


def scripted(name: str, tool: str, calls: CallBudget, tokens: int = 10, **arguments: Any) -> ScriptedModel:
    return ScriptedModel(id="scripted", name=name, provider="offline", tool=tool, arguments=arguments,
                         calls=calls, tokens=tokens)  # fmt: skip


@dataclass
class Loop:
    """The two agents' models, and what ran: each agent is built fresh for every call."""

    calls: CallBudget
    planner_model: ScriptedModel
    budget_model: ScriptedModel
    tool_bodies: Counter[str] = field(default_factory=Counter)

    def planner(self) -> Agent:
        return Agent(name="planner", model=self.planner_model, tools=[self._ask("budget")], telemetry=False)

    def budget(self) -> Agent:
        return Agent(name="budget", model=self.budget_model, tools=[self._ask("planner")], telemetry=False)

    def _ask(self, callee: str) -> Any:
        build = self.budget if callee == "budget" else self.planner

        def ask(question: str) -> str:
            self.tool_bodies[f"ask_{callee}"] += 1
            return str(build().run(question).content)

        ask.__name__ = f"ask_{callee}"
        ask.__doc__ = f"Ask the {callee}."
        return ask


def build_loop(calls: int = 6, tokens: int = 10) -> Loop:
    budget = CallBudget(calls)
    return Loop(
        budget,
        scripted("planner", "ask_budget", budget, tokens, question="planner asks"),
        scripted("budget", "ask_planner", budget, tokens, question="budget asks"),
    )


@dataclass
class TeamLoop:
    """A team ``planner`` whose leader delegates to member ``budget``, whose tool runs the team again."""

    calls: CallBudget
    mode: str
    leader_model: ScriptedModel
    budget_model: ScriptedModel
    teams: int = 0

    def team(self) -> Team:
        self.teams += 1
        budget = Agent(name="budget", id="budget", model=self.budget_model, tools=[self.ask_planner],
                       telemetry=False)  # fmt: skip
        return Team(
            name="planner", members=[budget], model=self.leader_model, mode=self.mode, telemetry=False
        )

    def ask_planner(self, question: str) -> str:
        """Ask the planner team."""
        return str(self.team().run(question).content)


def team_loop(mode: str = "coordinate", calls: int = 6) -> TeamLoop:
    budget = CallBudget(calls)
    delegate = "delegate_task_to_members" if mode == "broadcast" else "delegate_task_to_member"
    arguments = {"task": "price the plan"} | ({} if mode == "broadcast" else {"member_id": "budget"})
    return TeamLoop(
        budget,
        mode,
        scripted("planner", delegate, budget, **arguments),
        scripted("budget", "ask_planner", budget, question="budget asks"),
    )


def main() -> None:
    loop = build_loop()
    try:
        answer: str | None = str(loop.planner().run("Plan the team offsite").content)
        error = None
    except Exception as exc:
        answer, error = None, f"{type(exc).__name__}: {exc}"
    print("RESULT " + json.dumps({"answer": answer, "error": error, "calls": loop.calls.made,
                                  "budget_saw": loop.budget_model.tool_results,
                                  "tool_bodies": dict(loop.tool_bodies)}))  # fmt: skip


if __name__ == "__main__":
    main()
