"""An OpenAI Agents SDK agent calling an MCP server's tool: one hop, checked on both sides.

The SDK's ``MCPServerStdio`` starts the server in a subprocess (under ``opentelemetry-instrument``);
this process runs both the OpenAI Agents and the MCP instrumentation, the way
``opentelemetry-instrument`` loads them together.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import Agent, Runner
from agents.mcp import MCPServerStdio
from openai_agents_models import CallBudget, LoopModel

from otel_guard.instrumentation.mcp import MCPInstrumentor
from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
from tests.hop_spans import chain_of

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def instrumented() -> Iterator[None]:
    agents_instrumentor, mcp_instrumentor = OpenAIAgentsInstrumentor(), MCPInstrumentor()
    agents_instrumentor.instrument()
    mcp_instrumentor.instrument()
    yield
    mcp_instrumentor.uninstrument()
    agents_instrumentor.uninstrument()


def mcp_server(**env: str) -> MCPServerStdio:
    return MCPServerStdio(
        {
            "command": str(BIN / "opentelemetry-instrument"),
            "args": [str(BIN / "python"), str(HERE / "openai_agents_mcp_server.py")],
            "env": {
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
                **env,
            },
            "cwd": str(HERE),
        },
        name="lookup-server",
        client_session_timeout_seconds=30,
    )


async def test_an_mcp_tool_call_is_one_hop_and_its_chain_reaches_the_server(
    instrumented: None, spans
) -> None:
    async with mcp_server() as server:
        planner = Agent(name="planner", mcp_servers=[server])
        planner.model = LoopModel("planner", "lookup", CallBudget(1))
        result = await Runner.run(planner, "Find a hotel.")

    # The server saw the chain with the tool added once, not twice (which would be a false cycle).
    assert result.final_output == "planner answers: chain: planner > lookup"
    tool_span = spans.one("execute_tool lookup")
    assert chain_of(tool_span, spans)[0] == ("planner", "lookup")


async def test_a_refusal_by_the_server_reaches_the_model(instrumented: None) -> None:
    async with mcp_server(OTEL_GUARD_WORKSPACE="elsewhere") as server:
        planner = Agent(name="planner", mcp_servers=[server])
        planner.model = LoopModel("planner", "lookup", CallBudget(1))
        result = await Runner.run(planner, "Find a hotel.")

    output = str(result.final_output)
    assert output.startswith("planner answers: Refused by otel-guard (a2a_delegation_invalid")
    assert "foreign_workspace" in output
