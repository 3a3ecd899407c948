"""Planner and budget, two Claude Agent SDK agents that ask each other, on a scripted model.

The model is the scripted Messages API of ``scripted_api.py`` (the real CLI talks to it over HTTP on
127.0.0.1). Each agent is told apart by its prompt (``AGENT:planner``); each reply is decided from
what the request holds, as a real model reacts to its input:

- a new task (no tool result in the last turn): call the agent's tool (or start its sub-agent),
  while the shared :class:`CallBudget` lasts; then answer in text;
- a tool result (a refusal included: the call's error result): answer in text, quoting it.

Two shapes of the loop:

- :func:`tool_loop`: each agent runs as its own ``query()`` (the CLI's ``--agent``), with an SDK MCP
  tool named after the other agent whose handler runs the other agent's ``query()``;
- :func:`subagent_loop`: planner's sub-agent ``budget`` (an ``AgentDefinition``, started by the Agent
  tool) has the ``planner`` tool, which runs planner's ``query()`` again.

Run as a program (``opentelemetry-instrument python claude_loop.py``), it runs the tool loop once and
prints one line ``RESULT {json}``; settings come from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from claude_agent_sdk import (
    AgentDefinition,
    ClaudeAgentOptions,
    ResultMessage,
    create_sdk_mcp_server,
    query,
    tool,
)
from opentelemetry.instrumentation.utils import suppress_instrumentation
from scripted_api import (
    ScriptedAPI,
    prompt_text,
    result_text,
    system_text,
    text,
    tool_names,
    tool_results,
    tool_use,
)

MODEL = "claude-scripted"
AGENT_TOOLS = ("Agent", "Task")


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


def agent_of(request: dict[str, Any]) -> str:
    """Which agent a request is from: the ``AGENT:`` mark of its system prompt."""
    marks = [part.split()[0] for part in system_text(request).split("AGENT:")[1:]]
    return marks[-1] if marks else "?"


@dataclass
class Loop:
    """The scripted model of a loop, and what it saw."""

    calls: CallBudget
    subagents: bool = False
    results: dict[str, list[str]] = field(default_factory=dict)  # agent -> tool results it read
    errors: dict[str, list[bool]] = field(default_factory=dict)  # agent -> whether each was an error
    runs: dict[str, int] = field(default_factory=dict)  # agent -> runs (first requests) it made
    api: ScriptedAPI | None = None
    config_dir: str = ""
    suppressed: frozenset[str] = frozenset()  # agents whose runs are made with instrumentation suppressed

    def script(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        me = agent_of(request)
        results = tool_results(request)
        if results:
            seen = result_text(results[0])
            self.results.setdefault(me, []).append(seen)
            self.errors.setdefault(me, []).append(results[0].get("is_error") is True)
            return [text(f"{me} answers after {seen[:300]}")]
        prompt = prompt_text(request)
        if "<task-notification>" in prompt:
            return [text(f"{me} is done")]
        self.runs[me] = self.runs.get(me, 0) + 1
        other = "budget" if me == "planner" else "planner"
        names = tool_names(request)
        starter = next((name for name in names if name in AGENT_TOOLS), None)
        if self.subagents and me == "planner" and starter is not None and self.calls.take():
            start = {
                "subagent_type": "budget",
                "description": "ask budget",
                "prompt": "cost?",
                "run_in_background": False,
            }
            return [tool_use(starter, start)]
        wanted = f"mcp__team__{other}"
        if wanted in names and self.calls.take():
            return [tool_use(wanted, {"question": f"asked by {me}"})]
        return [text(f"{me} answers without tools")]

    def environment(self) -> dict[str, str]:
        assert self.api is not None
        return {
            "ANTHROPIC_BASE_URL": self.api.url,
            "ANTHROPIC_API_KEY": "sk-ant-scripted",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # The CLI's settings and transcripts go to a folder of the loop's, not the user's ~/.claude.
            "CLAUDE_CONFIG_DIR": self.config_dir,
        }

    def options(self, me: str, **more: Any) -> ClaudeAgentOptions:
        """``me``'s run: the CLI's ``--agent me``, with a tool named after the other agent."""
        other = "budget" if me == "planner" else "planner"
        tools = [self._ask(other)]
        agents = {me: AgentDefinition(description=f"The {me} agent.", prompt=f"AGENT:{me}")}
        allowed = [f"mcp__team__{other}"]
        if self.subagents and me == "planner":
            tools.append(self._ask("planner"))  # the sub-agent's: it runs in planner's CLI
            allowed.append("mcp__team__planner")
            agents["budget"] = AgentDefinition(
                description="The budget agent.",
                prompt="AGENT:budget",
                tools=["mcp__team__planner"],
                background=False,
            )
            allowed += list(AGENT_TOOLS)
        server = create_sdk_mcp_server("team", tools=tools)
        return ClaudeAgentOptions(
            model=MODEL,
            env=self.environment(),
            cwd=tempfile.gettempdir(),
            setting_sources=[],
            tools=["Agent"] if self.subagents and me == "planner" else [],
            mcp_servers={"team": server},
            allowed_tools=allowed,
            agents=agents,
            extra_args={"agent": me},
            max_turns=8,
            **more,
        )

    def _ask(self, other: str) -> Any:
        loop = self

        @tool(other, f"Ask the {other} agent.", {"question": str})
        async def ask(arguments: dict[str, Any]) -> dict[str, Any]:
            answer = await loop.run(other, arguments["question"])
            return {"content": [{"type": "text", "text": answer}]}

        return ask

    async def run(self, me: str, prompt: str, **more: Any) -> str:
        """Run ``me`` to its (last) result; its text."""
        return (await self.run_messages(me, prompt, **more))[0]

    async def run_messages(self, me: str, prompt: str, **more: Any) -> tuple[str, list[Any]]:
        with suppress_instrumentation() if me in self.suppressed else nullcontext():
            messages = [message async for message in query(prompt=prompt, options=self.options(me, **more))]
        results = [m for m in messages if isinstance(m, ResultMessage)]
        return (results[-1].result or "" if results else ""), messages


@contextmanager
def scripted_loop(*, max_tool_calls: int = 6, subagents: bool = False) -> Iterator[Loop]:
    loop = Loop(CallBudget(max_tool_calls), subagents)
    with ScriptedAPI(loop.script) as api, tempfile.TemporaryDirectory(prefix="claude-config-") as config:
        loop.api, loop.config_dir = api, config
        yield loop


def main() -> None:
    with scripted_loop(max_tool_calls=int(os.environ.get("LOOP_MAX_TOOL_CALLS", "6"))) as loop:
        output = asyncio.run(loop.run("planner", "Plan the team offsite"))
        report = {
            "output": output,
            "planner_runs": loop.runs.get("planner", 0),
            "budget_runs": loop.runs.get("budget", 0),
            "tool_calls": loop.calls.made,
            "budget_saw": loop.results.get("budget", []),
        }
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
    main()
