"""CrewAI agents that delegate to each other, driven by an offline scripted model.

:class:`ScriptedLLM` is a small subclass of CrewAI's model base class (``BaseLLM``): it calls its tool
at the start of a run and answers in text as soon as a tool result is back, at most
``max_tool_calls`` times in all, so an unguarded loop still ends. It records every request it is
sent and reports usage the way CrewAI's providers do. It speaks native function calling (tool-call
dicts, as OpenAI's API returns them) or, with ``native=False``, CrewAI's text format (``Action:`` /
``Final Answer:``).

Two shapes of planner ⇄ budget:

* :func:`build_loop`: standalone agents, each with a tool whose body runs the other agent
  (``kickoff``): planner -> ask_budget -> budget -> ask_planner -> planner -> ...;
* :func:`build_crew`: a crew whose planner delegates its task to the budget coworker ("Delegate work
  to coworker"), and a budget agent that can delegate back to the planner.

Run as a program (``opentelemetry-instrument python crewai_app.py [crew]``), it runs the planner once
and prints one line ``RESULT {json}`` with what happened; settings come from the environment.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

# CrewAI's own telemetry and trace collection would send to CrewAI's servers: off, before it loads.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from crewai import Agent, Crew, Task
from crewai.events.event_listener import event_listener
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool
from crewai.tools.agent_tools.agent_tools import AgentTools
from crewai_offline import watch_network
from pydantic import BaseModel, Field, PrivateAttr

DELEGATE = "delegate_work_to_coworker"


class ScriptedLLM(BaseLLM):
    """Calls ``tool`` at the start of each run (``max_tool_calls`` times in all), then answers."""

    agent: str = "agent"
    tool: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)
    max_tool_calls: int = 3
    native: bool = True
    _requests: list[list[dict[str, Any]]] = PrivateAttr(default_factory=list)
    _tool_results: list[str] = PrivateAttr(default_factory=list)
    _tool_calls: int = PrivateAttr(default=0)
    _usages: list[int] = PrivateAttr(default_factory=list)

    def call(
        self,
        messages: Any,
        tools: list[dict[str, Any]] | None = None,
        callbacks: list[Any] | None = None,
        available_functions: dict[str, Any] | None = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        sent = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
        self._requests.append([dict(message) for message in sent])
        answer = self._answer(sent, [tool["function"]["name"] for tool in tools or ()])
        prompt_tokens = len(json.dumps(sent, default=str)) // 4
        self._usages.append(prompt_tokens + 8)
        self._track_token_usage_internal({"prompt_tokens": prompt_tokens, "completion_tokens": 8})
        return answer

    def _answer(self, messages: list[dict[str, Any]], offered: list[str]) -> Any:
        result = self._tool_result(messages)
        if result is not None:
            self._tool_results.append(result)
            return self._text(f"{self.agent} answers after {self.tool}: {result[:300]}")
        can_call = self.tool in offered if self.native else self.tool in str(messages)
        if self._tool_calls < self.max_tool_calls and can_call:
            self._tool_calls += 1
            arguments = self.arguments or {"question": f"from {self.agent}"}
            if not self.native:
                return f"Thought: I ask.\nAction: {self.tool}\nAction Input: {json.dumps(arguments)}"
            call_id = f"call_{self.agent}_{self._tool_calls}"
            return [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": self.tool, "arguments": json.dumps(arguments)},
                }
            ]
        return self._text(f"{self.agent} answers without tools")

    def _tool_result(self, messages: list[dict[str, Any]]) -> str | None:
        last = messages[-1]
        if last.get("role") == "tool":
            return str(last.get("content"))
        if not self.native:
            # CrewAI's text format: the tool's observation is in the assistant's turn, then a nudge.
            for message in reversed(messages):
                content = str(message.get("content"))
                if message.get("role") == "assistant" and "\nObservation:" in content:
                    return content.split("\nObservation:", 1)[1].strip()
        return None

    def _text(self, answer: str) -> str:
        return answer if self.native else f"Thought: I know it.\nFinal Answer: {answer}"

    def supports_function_calling(self) -> bool:
        return self.native

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 128_000

    def get_input_tokens_count(self, messages: Any, tools: Any = None, response_model: Any = None) -> int:
        return len(json.dumps(messages, default=str)) // 4  # CrewAI's estimate, without its warning

    @property
    def requests(self) -> list[list[dict[str, Any]]]:
        return self._requests

    @property
    def usages(self) -> list[int]:
        """The tokens each request spent, as reported to CrewAI."""
        return self._usages

    @property
    def tool_results(self) -> list[str]:
        return self._tool_results

    @property
    def runs(self) -> int:
        """How many runs reached this model (a run's first request holds no tool result yet)."""
        return sum(1 for request in self._requests if self._tool_result(request) is None)


class Question(BaseModel):
    question: str = Field(description="What to ask")


class KickoffTool(BaseTool):
    """A tool whose body runs another agent on its own (``kickoff``) and returns its answer."""

    args_schema: type[BaseModel] = Question
    target: Any = None
    bodies: Any = None
    answer_when_refused: str | None = None  # set: the body handles a refused run and answers this

    def _run(self, question: str, **kwargs: Any) -> str:
        self.bodies[self.name] += 1
        try:
            return str(self.target.kickoff(question).raw)
        except RecursionError:  # what otel_guard.DelegationRefused is; this program does not import it
            if self.answer_when_refused is None:
                raise
            return self.answer_when_refused


@dataclass
class Loop:
    planner: Agent
    budget: Agent
    planner_model: ScriptedLLM
    budget_model: ScriptedLLM
    tool_bodies: Counter[str]
    crew: Crew | None = None

    def run(self) -> str:
        if self.crew is not None:
            return str(self.crew.kickoff().raw)
        return str(self.planner.kickoff("Plan the team offsite").raw)


def agent(role: str, model: ScriptedLLM, tools: list[BaseTool], **options: Any) -> Agent:
    return Agent(
        role=role,
        goal=f"Do the {role} work",
        backstory=f"The {role} of the team.",
        llm=model,
        tools=tools,
        verbose=False,
        **options,
    )


def build_loop(
    *,
    planner_tool: str = "ask_budget",
    budget_tool: str = "ask_planner",
    max_tool_calls: int = 3,
    native: bool = True,
) -> Loop:
    """Planner and budget, each with a tool (named as given) that runs the other agent."""
    bodies: Counter[str] = Counter()
    planner_model = ScriptedLLM(
        model="scripted", agent="planner", tool=planner_tool, max_tool_calls=max_tool_calls, native=native
    )
    budget_model = ScriptedLLM(
        model="scripted", agent="budget", tool=budget_tool, max_tool_calls=max_tool_calls, native=native
    )
    ask_budget = KickoffTool(name=planner_tool, description="Ask the budget agent what a plan costs.")
    ask_planner = KickoffTool(name=budget_tool, description="Ask the planner agent to plan.")
    planner = agent("planner", planner_model, [ask_budget])
    budget = agent("budget", budget_model, [ask_planner])
    ask_budget.target, ask_budget.bodies = budget, bodies
    ask_planner.target, ask_planner.bodies = planner, bodies
    return Loop(planner, budget, planner_model, budget_model, bodies)


def build_crew(
    *, max_tool_calls: int = 3, planner_role: str = "planner", budget_role: str = "budget"
) -> Loop:
    """A crew: the planner delegates its task to the budget coworker, who can delegate back."""

    def delegating(who: str, coworker: str) -> ScriptedLLM:
        arguments = {"task": f"help {who}", "context": "the team offsite", "coworker": coworker}
        return ScriptedLLM(
            model="scripted", agent=who, tool=DELEGATE, arguments=arguments, max_tool_calls=max_tool_calls
        )

    planner_model = delegating("planner", budget_role)
    budget_model = delegating("budget", planner_role)
    planner = agent(planner_role, planner_model, [], allow_delegation=True)
    # The budget agent's own delegation tools (a crew gives them only to the agent of a task).
    budget = agent(budget_role, budget_model, AgentTools(agents=[planner]).tools()[:1])
    task = Task(description="Plan the team offsite", expected_output="A plan with its cost", agent=planner)
    crew = Crew(agents=[planner, budget], tasks=[task], verbose=False)
    return Loop(planner, budget, planner_model, budget_model, Counter(), crew)


def main() -> None:
    external = watch_network()
    loop = build_crew() if "crew" in sys.argv[1:] else build_loop()
    # A standalone kickoff prints panels from CrewAI's event thread; RESULT must stay one clean line.
    event_listener.formatter.verbose = False
    output = loop.run()
    result = {
        "output": output,
        "planner_runs": loop.planner_model.runs,
        "budget_runs": loop.budget_model.runs,
        "tool_bodies": dict(loop.tool_bodies),
        "budget_saw": loop.budget_model.tool_results,
        "external_connections": external,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
