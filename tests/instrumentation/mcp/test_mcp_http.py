"""MCP over streamable HTTP: a real uvicorn server on 127.0.0.1, in this process and in another one.

The cross-process tests run ``mcp_app.py`` the way a user runs a server: under
``opentelemetry-instrument``, configured only by environment variables, spans printed by the console
exporter. The loop crosses the process boundary twice: planner (this process) -> budget (the other
process) -> planner (this process again), which the other process must refuse from the chain that
came in over HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from instrumentors import instrumentor_fixture
from mcp import Client
from mcp_app import ROUNDS, answer_text, build_server, http_server, listening_socket
from opentelemetry import propagate
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from servers import InstrumentedProgram, start_instrumented, user_environment, wait_until_serving

import otel_guard
from otel_guard.chain import generate_key
from otel_guard.instrumentation.mcp import MCPInstrumentor
from otel_guard.instrumentation.mcp._refusal import REFUSAL_META_KEY

APP = Path(__file__).with_name("mcp_app.py")
STARTUP_SECONDS = 60.0
"""Generous: the other process imports the SDKs on a 2-core machine shared with other test runs."""
CALL_SECONDS = 30.0

pytestmark = pytest.mark.integration


instrumented = instrumentor_fixture(MCPInstrumentor)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def side(attrs: Mapping[str, Any]) -> str:
    """Which side of an MCP call a hop span is (both are INTERNAL): the server's carries the
    request's ``jsonrpc.request.id``, the client's only ``mcp.method.name``."""
    return "server" if "jsonrpc.request.id" in attrs else "client" if "mcp.method.name" in attrs else "own"


@dataclass
class ServedHere:
    """The planner/budget server on uvicorn in a thread of this process."""

    url: str
    ran: list[str]


@pytest.fixture
def served_here() -> Iterator[ServedHere]:
    ran: list[str] = []
    sock = listening_socket()
    server = http_server(build_server(ran))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    try:
        yield ServedHere(f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", ran)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


async def call(url: str, tool: str, meta: Mapping[str, Any] | None = None, **arguments: Any) -> Any:
    with anyio.fail_after(CALL_SECONDS):
        async with Client(url) as client:
            if meta is None:
                return await client.call_tool(tool, arguments)
            # A tools/call sent the way a client without otel-guard sends it.
            request = mcp_types.CallToolRequest(
                params=mcp_types.CallToolRequestParams(name=tool, arguments=arguments, _meta=dict(meta))
            )
            return await client.session.send_request(request, mcp_types.CallToolResult)


# -- one process, real HTTP ---------------------------------------------------------------------


async def test_loop_over_http_is_refused_at_the_first_bounce(
    instrumented: MCPInstrumentor, spans: Any, served_here: ServedHere
) -> None:
    otel_guard.configure(cycle_rule="agent")
    url = served_here.url

    result = await call(url, "planner", rounds=ROUNDS, here=url, there=url)

    assert served_here.ran == ["planner", "budget"]
    assert not result.is_error
    text = answer_text(result)
    assert "budget, after planner said: [tool error] Refused by otel-guard (a2a_delegation_cycle" in text
    assert "agent planner is already in chain planner → budget" in text
    ours = [s for s in spans.all() if s.name.startswith("execute_tool ")]
    assert sorted(
        (
            s.name,
            side(attributes(s)),
            attributes(s)["otel_guard.decision"],
            attributes(s)["otel_guard.chain.depth"],
        )
        for s in ours
    ) == [
        ("execute_tool budget", "client", "allow", 2),
        ("execute_tool budget", "server", "allow", 2),
        ("execute_tool planner", "client", "allow", 1),
        ("execute_tool planner", "client", "refuse", 3),
        ("execute_tool planner", "server", "allow", 1),
    ]
    assert {s.kind for s in ours} == {SpanKind.INTERNAL}
    # Every hop is in one trace and one chain: both crossed HTTP in _meta.
    assert len({s.context.trace_id for s in ours}) == 1
    assert len({attributes(s)["otel_guard.chain.root"] for s in ours}) == 1


async def test_server_over_http_refuses_an_arriving_cycle(
    instrumented: MCPInstrumentor, served_here: ServedHere
) -> None:
    """The raw call does not go through ``call_tool``: only the server's check stands in the way."""
    otel_guard.configure(cycle_rule="agent")
    meta: dict[str, str] = {}
    with otel_guard.delegate("planner", kind="tool"), otel_guard.delegate("budget", kind="tool"):
        propagate.inject(meta)

    result = await call(served_here.url, "planner", meta, rounds=ROUNDS)
    assert served_here.ran == []
    assert result.is_error
    assert result.meta[REFUSAL_META_KEY]["code"] == "a2a_delegation_cycle"
    assert "agent planner is already in chain planner → budget" in answer_text(result)


# -- another process, under opentelemetry-instrument --------------------------------------------


class OtherProcess(InstrumentedProgram):
    """``mcp_app.py`` under ``opentelemetry-instrument`` in a subprocess; its output in files."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def keys(self) -> str:
        return self.env["OTEL_GUARD_KEYS"]

    def bodies_run(self) -> list[str]:
        return self.stderr_lines("mcp_app: ran ")


@pytest.fixture(scope="module")
def other_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtherProcess]:
    folder = tmp_path_factory.mktemp("mcp_app")
    kid, secret = generate_key()
    env = user_environment(f"{kid}:{secret}", OTEL_SERVICE_NAME="mcp-budget")
    process = start_instrumented("mcp_app", APP, folder, env, kind=OtherProcess)
    try:
        wait_until_serving([process], STARTUP_SECONDS)
        yield process
    finally:
        process.stop()


@pytest.mark.slow
async def test_cross_process_loop_is_refused_in_the_other_process(
    instrumented: MCPInstrumentor, spans: Any, served_here: ServedHere, other_process: OtherProcess
) -> None:
    otel_guard.configure(cycle_rule="agent", keys=other_process.keys)
    here, there = served_here.url, other_process.url
    bodies_before = len(other_process.bodies_run())
    refusals = {"otel_guard.decision": "refuse"}
    refused_before = len(other_process.wait_for_spans("execute_tool planner", 0, **refusals))
    allowed_before = len(
        other_process.wait_for_spans("execute_tool budget", 0, **{"otel_guard.decision": "allow"})
    )

    # planner runs here and asks budget there, which calls planner here again.
    result = await call(here, "planner", rounds=ROUNDS, here=here, there=there)

    assert not result.is_error
    assert "agent planner is already in chain planner → budget" in answer_text(result)
    assert served_here.ran == ["planner"]
    assert other_process.bodies_run()[bodies_before:] == ["budget"]
    # The other process checked budget's hop from the signed chain that came in over HTTP...
    allowed = other_process.wait_for_spans(
        "execute_tool budget", allowed_before + 1, **{"otel_guard.decision": "allow"}
    )
    budget_span = allowed[-1]
    assert budget_span["kind"] == str(SpanKind.INTERNAL)
    assert side(budget_span["attributes"]) == "server"
    assert budget_span["attributes"]["otel_guard.decision"] == "allow"
    assert budget_span["attributes"]["otel_guard.chain.agents"] == ["planner", "budget"]
    # ... and refused the bounce back into planner before it was sent.
    refused = other_process.wait_for_spans("execute_tool planner", refused_before + 1, **refusals)[-1]
    assert refused["kind"] == str(SpanKind.INTERNAL)
    assert side(refused["attributes"]) == "client"
    assert refused["attributes"]["otel_guard.decision"] == "refuse"
    assert refused["attributes"]["otel_guard.reason"] == "cycle"
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert [event["name"] for event in refused["events"]] == ["otel_guard.refused"]
    # One trace and one chain across both processes.
    planner_here = next(s for s in spans.named("execute_tool planner") if side(attributes(s)) == "client")
    assert budget_span["context"]["trace_id"] == f"0x{planner_here.context.trace_id:032x}"
    assert (
        budget_span["attributes"]["otel_guard.chain.root"]
        == attributes(planner_here)["otel_guard.chain.root"]
    )
    assert "otel_guard.chain=" not in other_process.stdout.read_text()  # the token never reaches a span


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signed_with_the_shared_key", "expected_reason"),
    [(True, "cycle"), (False, "bad_signature")],
)
async def test_other_process_refuses_before_the_tool_body(
    other_process: OtherProcess, signed_with_the_shared_key: bool, expected_reason: str
) -> None:
    """A raw client (no otel-guard instrumentation) sends a chain; the server alone refuses it."""
    kid, secret = generate_key()
    otel_guard.configure(keys=other_process.keys if signed_with_the_shared_key else f"{kid}:{secret}")
    meta: dict[str, str] = {}
    with otel_guard.delegate("budget", kind="tool"), otel_guard.delegate("planner", kind="tool"):
        propagate.inject(meta)
    bodies_before = len(other_process.bodies_run())
    reason = {"otel_guard.reason": expected_reason}
    refused_before = len(other_process.wait_for_spans("execute_tool budget", 0, **reason))

    result = await call(other_process.url, "budget", meta, rounds=0)

    assert result.is_error
    assert f"reason: {expected_reason}" in answer_text(result)
    assert result.meta[REFUSAL_META_KEY]["reason"] == expected_reason
    refused = other_process.wait_for_spans("execute_tool budget", refused_before + 1, **reason)
    assert len(refused) == refused_before + 1
    assert refused[-1]["kind"] == str(SpanKind.INTERNAL)
    assert side(refused[-1]["attributes"]) == "server"
    assert refused[-1]["attributes"]["otel_guard.decision"] == "refuse"
    assert other_process.bodies_run()[bodies_before:] == []
