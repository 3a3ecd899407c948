"""Planner and budget: two DSPy ``ReAct`` agents that ask each other, each with a scripted model.

The planner asks the budget agent what the offsite costs; the budget agent asks the planner what the
plan is; the planner asks the budget agent again, and so on. With a real model, that is the loop that
burns money, and DSPy's own limit (``max_iters``, per module call) never meets it: every bounce is a
fresh call. Each agent's tool runs the other agent. Each agent's model is DSPy's own ``DummyLM``
(``dspy.utils.dummies``) with a script: at the start of a call it asks the other agent, once something
comes back it finishes and answers with it. The scripts stop after ``MAX_TOOL_CALLS`` calls, so that
the program ends even when nothing stops the loop.

Without the guard (``python examples/dspy/app.py``) the agents bounce until the scripts give up.
Under the guard, with no change to this file::

    pip install '.[dspy]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/dspy/app.py

the budget agent's call back into the planner is refused (the planner is already on the path); the
budget agent reads the refusal as its tool's error observation and answers with what it has, and so
does the planner. The spans are printed as JSON when the program ends.
"""

from __future__ import annotations

from typing import Any

import dspy
from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.dummies import DummyLM

MAX_TOOL_CALLS = 6  # in all, both agents: where the scripts give up when nothing else stops them
tool_calls = 0


class Scripted(DummyLM):
    """DSPy's DummyLM, answering from what it reads: ask ``other``, then answer with what came back."""

    def __init__(self, agent: str, other: str) -> None:
        super().__init__([])
        self.agent, self.other = agent, other
        self._engine_spec = ScriptEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    def next_fields(self, system: str, user: str) -> dict[str, Any]:
        global tool_calls
        observed = (
            user.partition("[[ ## observation_0 ## ]]\n")[2].split("\n\n[[ ## ")[0].split("\n\nRespond")[0]
        )
        if "next_tool_name" not in system:  # ReAct's last step: the answer, from the trajectory
            return {"reasoning": "done", "answer": f"{self.agent}'s answer, from what {self.other} said"}
        if observed:  # a tool's result, or its error
            print(
                f"  {self.agent} got: {observed.splitlines()[-1][:200]!r}"
            )  # an error's last line: its text
            return {"next_thought": "I have it", "next_tool_name": "finish", "next_tool_args": {}}
        if tool_calls < MAX_TOOL_CALLS:
            tool_calls += 1
            print(f"{self.agent} calls {self.other} (tool call {tool_calls})")
            return {"next_thought": "ask", "next_tool_name": f"ask_{self.other}",
                    "next_tool_args": {"question": f"asked by {self.agent}"}}  # fmt: skip
        print(f"{self.agent}: the script gives up")
        return {"next_thought": "give up", "next_tool_name": "finish", "next_tool_args": {}}


class ScriptEngine(DummyEngine):
    """Where DummyLM makes its response: here, from the script."""

    def _complete_messages(self, messages: list[dict[str, Any]]) -> Response:
        owner = self.owner
        text = owner._format_answer_fields(owner.next_fields(messages[0]["content"], messages[-1]["content"]))
        message = Message.assistant([TextPart(text)])
        usage = Usage(input_tokens=0, output_tokens=0, total_tokens=0)
        return Response(id=None, model="scripted", message=message, finish_reason="stop", usage=usage)


def ask_budget(question: str) -> str:
    """Ask the budget agent what the plan costs."""
    return str(agent("budget", "planner", ask_planner)(question=question).answer)


def ask_planner(question: str) -> str:
    """Ask the planner agent what the plan is."""
    return str(agent("planner", "budget", ask_budget)(question=question).answer)


def agent(name: str, other: str, tool: Any) -> dspy.ReAct:
    """A ReAct agent named ``name`` (its hop's name) whose one tool asks ``other``."""
    react = dspy.ReAct("question -> answer", tools=[tool])
    react.name = name
    react.set_lm(Scripted(name, other))
    return react


def main() -> None:
    answer = agent("planner", "budget", ask_budget)(question="Plan the team offsite").answer
    print(f"planner's final answer: {answer!r} after {tool_calls} tool calls")


if __name__ == "__main__":
    main()
