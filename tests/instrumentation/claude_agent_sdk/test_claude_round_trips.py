"""What the CLI asks the guard about a tool call: an SDK MCP tool's hop is decided and ended by its
own server.

Each hook the guard gives a run is a round trip over the CLI's control channel (a JSON request read,
a task, the answer written). A tool of an SDK MCP server built while the SDK is instrumented is
decided by its server as it is about to run, runs in its hop and ends it when it returns, so the CLI
asks no hook about it; a tool the guard does not see run (here: a server built before
``instrument()``, as another process's MCP server would be) is still decided in ``PreToolUse`` and
ended by ``PostToolUse``. Real runs of the SDK and its CLI on the scripted Messages API; the control
requests are counted as the SDK reads them.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, create_sdk_mcp_server, query, tool
from claude_agent_sdk._internal.query import Query
from instrumentors import instrumentor_fixture
from scripted_api import ScriptedAPI, result_text, text, tool_results, tool_use

from otel_guard.instrumentation.claude_agent_sdk import ClaudeAgentSDKInstrumentor
from tests.hop_spans import decisions, hop_named

pytestmark = pytest.mark.integration

instrumented = instrumentor_fixture(ClaudeAgentSDKInstrumentor)


@tool("lookup", "Look up a city.", {"city": str})
async def lookup(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": f"{arguments['city']}: sunny"}]}


@tool("forecast", "Forecast a city's weather.", {"city": str})
async def forecast(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": f"{arguments['city']}: rain tomorrow"}]}


ANSWERED: list[int] = []  # when the model was asked with the tools' results (time.time_ns)


def script(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Both tools in one reply, then an answer quoting what they returned."""
    results = tool_results(request)
    if results:
        ANSWERED.append(time.time_ns())
        return [text("planner answers: " + " / ".join(sorted(result_text(r) for r in results)))]
    return [
        tool_use("mcp__kit__lookup", {"city": "Lisbon"}),
        tool_use("mcp__other__forecast", {"city": "Porto"}),
    ]


def test_an_sdk_tool_is_asked_about_by_no_hook_and_another_servers_tool_twice(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    instrumented.uninstrument()
    other = create_sdk_mcp_server("other", tools=[forecast])  # built unguarded: its calls' ends unseen
    instrumented.instrument()
    kit = create_sdk_mcp_server("kit", tools=[lookup])

    asked: list[tuple[str, str]] = []
    handle = Query._handle_control_request

    async def counted(self: Query, request: Any) -> Any:
        body = request.get("request", {})
        if body.get("subtype") == "hook_callback":
            hook_input = body.get("input") or {}
            asked.append((str(hook_input.get("hook_event_name")), str(hook_input.get("tool_name"))))
        return await handle(self, request)

    monkeypatch.setattr(Query, "_handle_control_request", counted)

    async def run(url: str, config: str) -> str:
        options = ClaudeAgentOptions(
            model="claude-scripted",
            env={
                "ANTHROPIC_BASE_URL": url,
                "ANTHROPIC_API_KEY": "sk-ant-scripted",
                "CLAUDE_CONFIG_DIR": config,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            },
            cwd=config,
            setting_sources=[],
            tools=[],
            mcp_servers={"kit": kit, "other": other},
            allowed_tools=["mcp__kit__lookup", "mcp__other__forecast"],
            extra_args={"agent": "planner"},
            agents={},
            max_turns=4,
        )
        results = [
            m async for m in query(prompt="Plan a trip.", options=options) if isinstance(m, ResultMessage)
        ]
        return results[-1].result or ""

    ANSWERED.clear()
    with ScriptedAPI(script) as api, tempfile.TemporaryDirectory(prefix="claude-config-") as config:
        output = asyncio.run(asyncio.wait_for(run(api.url, config), timeout=60))

    assert output == "planner answers: Lisbon: sunny / Porto: rain tomorrow"
    assert sorted(asked) == [
        ("PostToolUse", "mcp__other__forecast"),
        ("PreToolUse", "mcp__other__forecast"),
    ]
    assert sorted(d[:2] for d in decisions(spans)) == [
        ("execute_tool forecast", "allow"),
        ("execute_tool lookup", "allow"),
        ("invoke_agent planner", "allow"),
    ]
    run_span = hop_named(spans, "invoke_agent planner")
    for name in ("execute_tool lookup", "execute_tool forecast"):
        call = hop_named(spans, name)
        assert call.parent is not None
        assert call.parent.span_id == run_span.context.span_id
        assert call.end_time is not None
        assert run_span.end_time is not None
        assert call.end_time <= run_span.end_time
    # The SDK tool's hop ended when the tool returned, before the CLI sent its result to the model
    # (not when the run closed).
    lookup_end = hop_named(spans, "execute_tool lookup").end_time
    assert lookup_end is not None
    assert ANSWERED
    assert lookup_end < ANSWERED[0]
