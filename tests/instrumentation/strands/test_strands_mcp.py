"""A Strands agent's MCP tool call is a hop, and its chain leaves the process with the call.

Strands' ``MCPClient`` merges the caller's OpenTelemetry context into each ``tools/call`` request's
``_meta``, so the W3C baggage (the chain, signed with the workspace's key) reaches the MCP server in
its own process: a guard there can check the call again. The server of this test reports the
baggage it received.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from mcp import StdioServerParameters, stdio_client
from strands import Agent
from strands.tools.mcp import MCPClient
from strands_loop import CallBudget, ScriptedModel
from strands_support import decisions, instrumented_fixture

import otel_guard
from otel_guard.chain import Keyring, decode
from otel_guard.instrumentation.strands import StrandsInstrumentor
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

instrumented = instrumented_fixture()

SERVER = Path(__file__).with_name("strands_mcp_server.py")
KEY = {"offsite": b"k" * 32}

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def chain_in(baggage_header: str) -> list[str]:
    """The agents of the chain a W3C baggage header carries (verified with the test's key)."""
    members = dict(member.split("=", 1) for member in baggage_header.split(","))
    return [hop.agent for hop in decode(unquote(members[CHAIN_BAGGAGE_KEY]), Keyring(KEY)).hops]


async def test_the_chain_reaches_the_mcp_server_with_the_tool_call(
    instrumented: StrandsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(keys=KEY)
    client = MCPClient(
        lambda: stdio_client(StdioServerParameters(command=sys.executable, args=[str(SERVER)]))
    )
    with client:
        model = ScriptedModel("planner", "find_venue", CallBudget(1), tool_input={"city": "Lisbon"})
        agent = Agent(name="planner", model=model, tools=client.list_tools_sync(), callback_handler=None)
        await agent.invoke_async("Find a venue")

    ((result,),) = [model.tool_results]
    assert result["status"] == "success"
    (baggage_header,) = [block["text"] for block in result["content"]]
    assert chain_in(baggage_header) == ["planner", "find_venue"]
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool find_venue", "allow", ("planner", "find_venue")),
    ]
