"""Google ADK agents calling each other over A2A (ADK's ``RemoteA2aAgent`` and ``to_a2a``), guarded by
otel-guard's A2A instrumentation: the chain crosses HTTP and a bounce back is refused.

Budget and planner are each served by ADK's own A2A app on uvicorn (127.0.0.1, a free port, started
and stopped by the test). A local planner asks budget through ``AgentTool(RemoteA2aAgent("budget"))``;
the served budget asks planner back the same way. The send back to planner is refused in budget's
server before any request leaves it; ADK reports the failed remote call to budget's model, which
answers with what it has.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from google.adk.a2a.utils.agent_to_a2a import to_a2a
from google.adk.agents import LlmAgent
from google.adk.agents.remote_a2a_agent import AGENT_CARD_WELL_KNOWN_PATH, RemoteA2aAgent
from google.adk.tools.agent_tool import AgentTool
from google_adk_models import ScriptedModel, ToolCalls, final_text, run
from opentelemetry.trace import SpanKind

import otel_guard
from otel_guard.instrumentation.a2a import A2AInstrumentor
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from tests.hop_spans import chain_of
from tests.instrumentation.instrumentors import instrumentor_fixture

pytestmark = [
    pytest.mark.integration,
    # ADK warns once that its A2A support is experimental.
    pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\]:UserWarning"),
]

adk = instrumentor_fixture(GoogleADKInstrumentor)
a2a = instrumentor_fixture(A2AInstrumentor)
START_SECONDS = 15.0


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serving(agent: LlmAgent) -> AsyncIterator[str]:
    """``agent`` served over A2A by ADK's own app on 127.0.0.1; yields its agent card's URL."""
    sock = free_socket()
    port = sock.getsockname()[1]
    app = to_a2a(agent, host="127.0.0.1", port=port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_SECONDS
    while not server.started:
        assert thread.is_alive(), f"the A2A server of {agent.name} exited"
        assert time.monotonic() < deadline, f"the A2A server of {agent.name} did not start"
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}{AGENT_CARD_WELL_KNOWN_PATH}"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, START_SECONDS)
        sock.close()
        assert not thread.is_alive(), f"the A2A server of {agent.name} did not stop"


def remote(name: str, card_url: str) -> AgentTool:
    return AgentTool(RemoteA2aAgent(name=name, agent_card=card_url))


@pytest.fixture
def guard_both(adk: GoogleADKInstrumentor, a2a: A2AInstrumentor) -> None:
    otel_guard.configure(cycle_rule="agent")


@pytest.mark.usefixtures("guard_both")
async def test_a_bounce_back_over_a2a_is_refused_and_both_agents_answer(spans: Any) -> None:
    calls = ToolCalls(6)
    served_planner = LlmAgent(
        name="planner", model=ScriptedModel(agent="planner", tool="budget", tool_calls=calls)
    )
    served_budget = LlmAgent(
        name="budget", model=ScriptedModel(agent="budget", tool="planner", tool_calls=calls)
    )
    async with serving(served_planner) as planner_card, serving(served_budget) as budget_card:
        served_budget.tools.append(remote("planner", planner_card))
        served_planner.tools.append(remote("budget", budget_card))
        planner = LlmAgent(
            name="planner", model=ScriptedModel(agent="planner", tool="budget", tool_calls=calls)
        )
        planner.tools.append(remote("budget", budget_card))

        events = await run(planner)

    # planner -> budget (over A2A), budget -> planner (refused before it was sent): two tool calls.
    assert calls.left == 6 - 2
    assert served_planner.model.requests == []  # type: ignore[union-attr]  # never reached
    result = served_budget.model.function_responses[0].response or {}  # type: ignore[union-attr]
    assert "Delegation cycle: agent planner is already in chain planner → budget" in str(result)
    assert final_text(events) == "planner answers after budget ok"

    hops = sorted(
        (s for s in spans.all() if s.attributes and "otel_guard.decision" in s.attributes),
        key=lambda s: s.start_time or 0,
    )
    assert [(s.name, s.kind, s.attributes["otel_guard.decision"], chain_of(s, spans)[0]) for s in hops] == [
        ("invoke_agent planner", SpanKind.INTERNAL, "allow", ("planner",)),
        ("invoke_agent budget", SpanKind.CLIENT, "allow", ("planner", "budget")),  # the A2A send
        ("invoke_agent budget", SpanKind.INTERNAL, "allow", ("planner", "budget")),  # checked again there
        ("invoke_agent planner", SpanKind.CLIENT, "refuse", ("planner", "budget", "planner")),
    ]
    # One trace across the HTTP hop: the server continued the caller's.
    assert len({s.context.trace_id for s in hops}) == 1


async def test_with_the_a2a_instrumentation_off_a_remote_agent_is_a_hop_of_adk_s_own(
    adk: GoogleADKInstrumentor, spans: Any
) -> None:
    """No A2A send carries the chain, so the call into the remote agent is the ADK hop: the chain stays
    in this process and the remote side starts its own."""
    assert not A2AInstrumentor().is_instrumented_by_opentelemetry
    calls = ToolCalls(1)
    served_budget = LlmAgent(name="budget", model=ScriptedModel(agent="budget"))
    async with serving(served_budget) as budget_card:
        planner = LlmAgent(
            name="planner", model=ScriptedModel(agent="planner", tool="budget", tool_calls=calls)
        )
        planner.tools.append(remote("budget", budget_card))

        events = await run(planner)

    assert calls.left == 0
    assert final_text(events).startswith("planner answers after budget")
    hops = sorted(
        (s for s in spans.all() if s.attributes and "otel_guard.decision" in s.attributes),
        key=lambda s: s.start_time or 0,
    )
    assert [(s.name, s.kind, chain_of(s, spans)[0]) for s in hops] == [
        ("invoke_agent planner", SpanKind.INTERNAL, ("planner",)),
        ("invoke_agent budget", SpanKind.INTERNAL, ("planner", "budget")),  # the AgentTool call
        ("invoke_agent budget", SpanKind.INTERNAL, ("budget",)),  # the served agent's run, a new chain
    ]
