"""An SDK MCP tool call is decided by its own server, in the hop of the agent that made it.

The CLI names such a call to its server by its ``tool_use_id`` alone and asks no hook about it; the
guard finds the agent by the reply that made the call (a sub-agent's names the Agent call that
started it). Real runs of the SDK and its CLI on the scripted Messages API: planner (the CLI's
``--agent``) starts its sub-agent ``budget`` and calls the SDK tool ``lookup`` while ``budget`` is
running and calling the SDK tool ``forecast``: each of the two tools returns only once the other has
begun, so the main thread's call is decided while the sub-agent runs. The control requests are
counted as the SDK reads them.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import pytest
from claude_agent_sdk import (
    AgentDefinition,
    ClaudeAgentOptions,
    ResultMessage,
    create_sdk_mcp_server,
    query,
    tool,
)
from claude_agent_sdk._internal.query import Query
from claude_loop import agent_of
from instrumentors import instrumentor_fixture
from opentelemetry.trace import StatusCode
from scripted_api import ScriptedAPI, prompt_text, result_text, text, tool_results, tool_use

from otel_guard.instrumentation.claude_agent_sdk import ClaudeAgentSDKInstrumentor
from tests.hop_spans import decisions, hop_named

pytestmark = pytest.mark.integration

instrumented = instrumentor_fixture(ClaudeAgentSDKInstrumentor)


class Asked:
    """The hooks the CLI asks the Python process about, as (event, tool)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hooks: list[tuple[str, str]] = []
        handle = Query._handle_control_request
        asked = self

        async def counted(self: Query, request: Any) -> Any:
            body = request.get("request", {})
            if body.get("subtype") == "hook_callback":
                hook_input = body.get("input") or {}
                asked.hooks.append((str(hook_input.get("hook_event_name")), str(hook_input.get("tool_name"))))
            return await handle(self, request)

        monkeypatch.setattr(Query, "_handle_control_request", counted)


def options(url: str, config: str, kit: Any, background: bool) -> ClaudeAgentOptions:
    budget = AgentDefinition(
        description="The budget agent.",
        prompt="AGENT:budget",
        tools=["mcp__kit__forecast"],
        background=background,
    )
    return ClaudeAgentOptions(
        model="claude-scripted",
        env={
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "sk-ant-scripted",
            "CLAUDE_CONFIG_DIR": config,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        cwd=config,
        setting_sources=[],
        tools=["Agent"],
        mcp_servers={"kit": kit},
        allowed_tools=["Agent", "mcp__kit__lookup", "mcp__kit__forecast"],
        agents={
            "planner": AgentDefinition(description="The planner.", prompt="AGENT:planner"),
            "budget": budget,
        },
        extra_args={"agent": "planner"},
        max_turns=8,
    )


async def answer(url: str, config: str, kit: Any, *, background: bool = False) -> str:
    messages = query(prompt="Plan a trip.", options=options(url, config, kit, background))
    results = [m async for m in messages]
    return next((m.result or "" for m in reversed(results) if isinstance(m, ResultMessage)), "")


def assert_each_call_decided_in_its_agents_hop(asked: Any, spans: Any) -> None:
    """No hook was asked about a ``kit`` tool; ``lookup`` ran in planner's hop, ``forecast`` in the
    sub-agent budget's, each ended before its agent's hop."""
    assert not [hook for hook in asked.hooks if hook[1].startswith("mcp__kit__")], asked.hooks
    assert sorted(decisions(spans)) == [
        ("execute_tool forecast", "allow", ("planner", "budget", "forecast")),
        ("execute_tool lookup", "allow", ("planner", "lookup")),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("invoke_agent planner", "allow", ("planner",)),
    ]
    for call, agent in (
        ("execute_tool lookup", "invoke_agent planner"),
        ("execute_tool forecast", "invoke_agent budget"),
    ):
        span, parent = hop_named(spans, call), hop_named(spans, agent)
        assert span.parent is not None
        assert span.parent.span_id == parent.context.span_id, (call, agent)
        assert span.end_time is not None
        assert parent.end_time is not None
        assert span.end_time <= parent.end_time


def test_the_main_thread_and_a_running_sub_agent_call_sdk_tools_each_in_its_own_hop(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    begun: dict[str, asyncio.Event] = {}  # tool -> it has begun; made in the run's event loop
    seen: dict[str, list[str]] = {}

    @tool("lookup", "Look up a city.", {"city": str})
    async def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
        begun["lookup"].set()
        await asyncio.wait_for(begun["forecast"].wait(), timeout=20)
        return {"content": [{"type": "text", "text": f"{arguments['city']}: sunny"}]}

    @tool("forecast", "Forecast a city's weather.", {"city": str})
    async def forecast(arguments: dict[str, Any]) -> dict[str, Any]:
        begun["forecast"].set()
        await asyncio.wait_for(begun["lookup"].wait(), timeout=20)
        return {"content": [{"type": "text", "text": f"{arguments['city']}: rain tomorrow"}]}

    def script(request: dict[str, Any]) -> list[dict[str, Any]]:
        me, results = agent_of(request), tool_results(request)
        if results:
            seen.setdefault(me, []).append(result_text(results[0]))
        if me == "budget":
            return (
                [text(f"budget answers: {seen['budget'][0]}")]
                if results
                else [tool_use("mcp__kit__forecast", {"city": "Porto"})]
            )
        if "<task-notification>" in prompt_text(request):
            return [text("planner is done")]
        if not results:
            start = {"subagent_type": "budget", "description": "ask budget", "prompt": "Porto?"}
            return [tool_use("Agent", {**start, "run_in_background": True})]
        if len(seen["planner"]) == 1:  # the sub-agent is running: planner looks up meanwhile
            return [tool_use("mcp__kit__lookup", {"city": "Lisbon"})]
        return [text(f"planner answers: {seen['planner'][-1]}")]

    asked = Asked(monkeypatch)
    kit = create_sdk_mcp_server("kit", tools=[lookup, forecast])

    async def run(url: str, config: str) -> str:
        begun.update(lookup=asyncio.Event(), forecast=asyncio.Event())
        return await answer(url, config, kit, background=True)

    with ScriptedAPI(script) as api, tempfile.TemporaryDirectory(prefix="claude-config-") as config:
        asyncio.run(asyncio.wait_for(run(api.url, config), timeout=60))

    assert seen["budget"] == ["Porto: rain tomorrow"]
    assert "Lisbon: sunny" in seen["planner"]
    assert ("PreToolUse", "Agent") in asked.hooks
    assert_each_call_decided_in_its_agents_hop(asked, spans)
    # The main thread's call was decided while the sub-agent ran, and the two calls ran at once.
    budget, forecast_span = hop_named(spans, "invoke_agent budget"), hop_named(spans, "execute_tool forecast")
    lookup_span = hop_named(spans, "execute_tool lookup")
    assert budget.start_time is not None
    assert budget.end_time is not None
    assert forecast_span.start_time is not None
    assert forecast_span.end_time is not None
    assert lookup_span.start_time is not None
    assert lookup_span.end_time is not None
    assert budget.start_time < lookup_span.start_time < budget.end_time
    assert lookup_span.start_time < forecast_span.end_time
    assert forecast_span.start_time < lookup_span.end_time


def test_a_reply_that_starts_a_sub_agent_and_calls_an_sdk_tool_decides_each_in_its_own_hop(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """planner's one reply calls ``lookup`` and starts ``budget`` (in the foreground), which calls
    ``forecast``: the CLI may run the two calls in either order."""
    seen: dict[str, list[str]] = {}

    @tool("lookup", "Look up a city.", {"city": str})
    async def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": f"{arguments['city']}: sunny"}]}

    @tool("forecast", "Forecast a city's weather.", {"city": str})
    async def forecast(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": f"{arguments['city']}: rain tomorrow"}]}

    def script(request: dict[str, Any]) -> list[dict[str, Any]]:
        me, results = agent_of(request), tool_results(request)
        if me == "budget" or results:
            seen.setdefault(me, []).extend(result_text(r) for r in results)
        if me == "budget":
            return (
                [text("budget answers")] if results else [tool_use("mcp__kit__forecast", {"city": "Porto"})]
            )
        if results or "planner" in seen:
            return [text("planner answers")]
        seen["planner"] = []
        start = {"subagent_type": "budget", "description": "ask budget", "prompt": "Porto?"}
        return [
            tool_use("mcp__kit__lookup", {"city": "Lisbon"}),
            tool_use("Agent", {**start, "run_in_background": False}),
        ]

    asked = Asked(monkeypatch)
    kit = create_sdk_mcp_server("kit", tools=[lookup, forecast])
    with ScriptedAPI(script) as api, tempfile.TemporaryDirectory(prefix="claude-config-") as config:
        output = asyncio.run(asyncio.wait_for(answer(api.url, config, kit), timeout=60))

    assert output == "planner answers"
    assert seen["budget"] == ["Porto: rain tomorrow"]
    assert "Lisbon: sunny" in seen["planner"]
    assert_each_call_decided_in_its_agents_hop(asked, spans)


def test_an_sdk_tools_error_result_ends_its_hop_with_the_error(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    @tool("lookup", "Look up a city.", {"city": str})
    async def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": "no such city"}], "is_error": True}

    def script(request: dict[str, Any]) -> list[dict[str, Any]]:
        results = tool_results(request)
        if results:
            return [text(f"planner answers: {result_text(results[0])}")]
        return [tool_use("mcp__kit__lookup", {"city": "Atlantis"})]

    kit = create_sdk_mcp_server("kit", tools=[lookup])
    with ScriptedAPI(script) as api, tempfile.TemporaryDirectory(prefix="claude-config-") as config:
        output = asyncio.run(asyncio.wait_for(answer(api.url, config, kit), timeout=60))

    assert output == "planner answers: no such city"
    call = hop_named(spans, "execute_tool lookup")
    assert call.status.status_code == StatusCode.ERROR
    assert "no such city" in (call.status.description or "")
