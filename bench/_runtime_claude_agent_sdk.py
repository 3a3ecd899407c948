"""The Claude Agent SDK for ``bench/runtime_overhead.py``: one run that makes one tool call.

A ``query()`` run as ``planner`` (the CLI's ``--agent``) whose scripted model calls the SDK MCP tool
``lookup`` once, then answers with its result. The model is the tests' scripted Messages API
(``tests/instrumentation/claude_agent_sdk/scripted_api.py``) on 127.0.0.1, started once; each run
starts the Claude Code CLI the SDK bundles, as every run does. What is measured is this process's
work (the SDK's and the guard's); the CLI is a process of its own (callgrind does not follow it, and
its start-up, about 1.5 s, dominates the wall time of both arms alike).

Run it with the Claude Agent SDK environment: ``.venv-runtimes/claude-agent-sdk/bin/python
bench/runtime_overhead.py --runtime claude-agent-sdk``.

``claude-agent-sdk-hook`` is the same run with no guard at all; its "guarded" arm gives the run an
app's own ``PreToolUse`` hook matching the tool that answers ``{}``: what the SDK itself spends on the
one hook round trip a guarded tool call needs (the CLI's control request read, a task, the answer
written), the part of the guarded row that is the runtime's and not the guard's.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

SCRIPTED_API = Path(__file__).resolve().parents[1] / "tests" / "instrumentation" / "claude_agent_sdk"


def runtime(runtime_class: Any) -> Any:
    """The guarded run: the guard's instrumentor on and off."""
    return _runtime(runtime_class, hook_only=False)


def hook_runtime(runtime_class: Any) -> Any:
    """The bare run, with and without an app's own ``PreToolUse`` hook that answers ``{}``."""
    return _runtime(runtime_class, hook_only=True)


def _runtime(runtime_class: Any, *, hook_only: bool) -> Any:
    sys.path.insert(0, str(SCRIPTED_API))
    from claude_agent_sdk import (
        AgentDefinition,
        ClaudeAgentOptions,
        HookMatcher,
        ResultMessage,
        create_sdk_mcp_server,
        query,
    )
    from claude_agent_sdk import tool as sdk_tool
    from scripted_api import ScriptedAPI, result_text, text, tool_results, tool_use

    from otel_guard.instrumentation.claude_agent_sdk import ClaudeAgentSDKInstrumentor

    def script(request: dict[str, Any]) -> list[dict[str, Any]]:
        results = tool_results(request)
        if results:
            return [text(f"planner answers: {result_text(results[0])}")]
        return [tool_use("mcp__kit__lookup", {"city": "Lisbon"})]

    @sdk_tool("lookup", "Look up a city.", {"city": str})
    async def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": f"{arguments['city']}: sunny"}]}

    async def answer_nothing(data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
        return {}

    api = ScriptedAPI(script).__enter__()  # for the process's life: the bench's runs share it
    config = tempfile.mkdtemp(prefix="claude-bench-")
    hooked = [False]  # hook_only: the "guarded" arm gives the run the app's hook

    async def run() -> str:
        hooks = (
            {"PreToolUse": [HookMatcher(matcher="mcp__.*", hooks=[answer_nothing])]} if hooked[0] else None
        )
        options = ClaudeAgentOptions(
            model="claude-scripted",
            env={
                "ANTHROPIC_BASE_URL": api.url,
                "ANTHROPIC_API_KEY": "sk-ant-bench",
                "CLAUDE_CONFIG_DIR": config,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            },
            cwd=config,
            setting_sources=[],
            tools=[],
            mcp_servers={"kit": create_sdk_mcp_server("kit", tools=[lookup])},
            allowed_tools=["mcp__kit__lookup"],
            agents={"planner": AgentDefinition(description="The planner.", prompt="You plan.")},
            extra_args={"agent": "planner"},
            hooks=hooks,
        )
        answer = ""
        async for message in query(prompt="Plan a trip to Lisbon.", options=options):
            if isinstance(message, ResultMessage):
                answer = message.result or ""
        return answer

    def check(out: str) -> bool:
        return "sunny" in out

    if hook_only:

        def switch(on: bool) -> None:
            hooked[0] = on

        return runtime_class("claude-agent-sdk-hook", run, None, check, switch=switch)
    return runtime_class("claude-agent-sdk", run, ClaudeAgentSDKInstrumentor(), check)
