"""A2A across processes: Planner and Budget each in their own process, run the way a user runs them.

Each agent is ``a2a_apps/travel_agent.py`` under ``opentelemetry-instrument``, configured only by
environment variables (``OTEL_GUARD_*``, the console span exporter), serving on 127.0.0.1. The test
process is the user: an instrumented A2A client that asks Planner for a plan. Planner's process asks
Budget's process, which asks Planner's process again: the chain that stops that bounce came in over
HTTP, signed with the key the processes share.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a_apps.travel_agent import CALL_SECONDS, JSONRPC, RAN_PREFIX, REST, ask, request
from google.protobuf.json_format import MessageToDict
from instrumentors import instrumentor_fixture
from opentelemetry import propagate
from opentelemetry.trace import SpanKind
from servers import InstrumentedProgram, start_instrumented, user_environment, wait_until_serving

import otel_guard
from otel_guard.chain import generate_key
from otel_guard.instrumentation.a2a import A2AInstrumentor

APP = Path(__file__).parent / "a2a_apps" / "travel_agent.py"
STARTUP_SECONDS = 90.0
"""Generous: each process imports every installed runtime's SDK on a 2-core machine shared with
other test runs (opentelemetry-instrument loads every otel-guard instrumentor)."""
REFUSED_TEXT = "Delegation cycle: agent planner is already in chain planner → budget"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


instrumented = instrumentor_fixture(A2AInstrumentor)


class AgentProcess(InstrumentedProgram):
    """One travel agent under ``opentelemetry-instrument``; its output in files."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hop_spans(self, name: str, count: int, **attributes: Any) -> list[dict[str, Any]]:
        """The spans ``name`` with these attribute values, once ``count`` of them were exported."""
        return self.wait_for_spans(name, count, within=CALL_SECONDS, **attributes)

    def executions(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stderr_lines(RAN_PREFIX)]


def start(name: str, peer: str, folder: Path, env: dict[str, str], *args: str) -> AgentProcess:
    options = ("--name", name, "--peer-port-file", folder / f"{peer}.port", *args)
    env = {**env, "OTEL_SERVICE_NAME": name}
    return start_instrumented(name, APP, folder, env, *options, kind=AgentProcess)


@dataclass
class Pair:
    planner: AgentProcess
    budget: AgentProcess
    keys: str
    binding: str = JSONRPC
    streaming: bool = False


@pytest.fixture(scope="module")
def enforcing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Both agents enforce (JSON-RPC, no streaming)."""
    folder = tmp_path_factory.mktemp("a2a_enforcing")
    kid, secret = generate_key()
    keys = f"{kid}:{secret}"
    env = user_environment(keys)
    planner = start("planner", "budget", folder, env)
    budget = start("budget", "planner", folder, env)
    try:
        wait_until_serving([planner, budget], STARTUP_SECONDS)
        yield Pair(planner, budget, keys)
    finally:
        planner.stop()
        budget.stop()


@pytest.fixture(
    scope="module",
    params=[pytest.param((JSONRPC, False), id="jsonrpc"), pytest.param((REST, True), id="rest-streaming")],
)
def budget_observing(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    """Planner enforces; Budget's process is still in observe mode."""
    binding, streaming = request.param
    folder = tmp_path_factory.mktemp("a2a_budget_observing")
    kid, secret = generate_key()
    keys = f"{kid}:{secret}"
    env = user_environment(keys)
    options = ("--binding", binding, *(["--streaming"] if streaming else []))
    planner = start("planner", "budget", folder, env, *options)
    budget = start("budget", "planner", folder, {**env, "OTEL_GUARD_MODE": "observe"}, *options)
    try:
        wait_until_serving([planner, budget], STARTUP_SECONDS)
        yield Pair(planner, budget, keys, binding, streaming)
    finally:
        planner.stop()
        budget.stop()


async def test_budget_process_refuses_the_bounce_into_planner_before_sending(
    instrumented: A2AInstrumentor, spans: Any, enforcing: Pair
) -> None:
    otel_guard.configure(cycle_rule="agent", keys=enforcing.keys)
    planner, budget = enforcing.planner, enforcing.budget
    before = len(planner.executions()), len(budget.executions())

    answer = await ask(planner.url, "a 3-day Lisbon trip under 1500 EUR", "plan")

    assert answer.startswith("plan: 3 days in Lisbon <price: 1200 EUR [A2ADelegationRefused: ")
    assert REFUSED_TEXT in answer
    # Planner ran once, Budget once; Budget's call back never left Budget's process.
    assert planner.executions()[before[0] :] == [
        {"agent": "planner", "skill": "plan", "hops": 1, "chain": ["planner"]}
    ]
    assert budget.executions()[before[1] :] == [
        {"agent": "budget", "skill": "price", "hops": 2, "chain": ["planner", "budget"]}
    ]
    refused = budget.hop_spans("invoke_agent planner", 1, **{"otel_guard.decision": "refuse"})[-1]
    assert refused["kind"] == str(SpanKind.CLIENT)
    assert refused["attributes"]["otel_guard.reason"] == "cycle"
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert [event["name"] for event in refused["events"]] == ["otel_guard.refused"]
    # Planner's process checked the hop that came in from this process without adding it twice.
    planner_server = planner.hop_spans("invoke_agent planner", 1, **{"otel_guard.decision": "allow"})
    assert planner_server[-1]["kind"] == str(SpanKind.INTERNAL)
    assert planner_server[-1]["attributes"]["otel_guard.chain.depth"] == 1
    # One trace and one chain across the three processes.
    mine = next(s for s in spans.named("invoke_agent planner") if s.kind is SpanKind.CLIENT)
    trace_id = f"0x{mine.context.trace_id:032x}"
    root = dict(mine.attributes or {})["otel_guard.chain.root"]
    for span in (refused, planner_server[-1]):
        assert span["context"]["trace_id"] == trace_id
        assert span["attributes"]["otel_guard.chain.root"] == root
    # The token never reaches a span.
    for agent in (planner, budget):
        assert "otel_guard.chain=" not in agent.stdout.read_text()


@pytest.mark.parametrize(
    ("signed_with_the_shared_key", "reason", "code"),
    [(True, "cycle", "a2a_delegation_cycle"), (False, "bad_signature", "a2a_delegation_invalid")],
)
async def test_budget_process_refuses_an_arriving_chain_before_its_executor(
    enforcing: Pair, signed_with_the_shared_key: bool, reason: str, code: str
) -> None:
    """A client without otel-guard sends the chain budget -> planner: Budget's server alone stands."""
    kid, secret = generate_key()
    otel_guard.configure(keys=enforcing.keys if signed_with_the_shared_key else f"{kid}:{secret}")
    headers = {"A2A-Version": "1.0"}
    with otel_guard.delegate("budget"), otel_guard.delegate("planner"):
        propagate.inject(headers)
    before = len(enforcing.budget.executions())
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": MessageToDict(request("price this", "price")),
    }

    async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
        response = await client.post(f"{enforcing.budget.url}/", json=body, headers=headers)

    error = response.json()["error"]
    assert error["code"] == -32099
    assert error["data"][0]["metadata"]["code"] == code
    assert error["data"][0]["metadata"]["reason"] == reason
    assert error["data"][0]["metadata"]["status"] == "409"
    refusals = enforcing.budget.hop_spans("invoke_agent budget", 1, **{"otel_guard.reason": reason})
    assert refusals[-1]["kind"] == str(SpanKind.INTERNAL)
    assert refusals[-1]["attributes"]["otel_guard.decision"] == "refuse"
    assert enforcing.budget.executions()[before:] == []


async def test_planner_process_refuses_the_bounce_that_an_observing_budget_let_through(
    instrumented: A2AInstrumentor, budget_observing: Pair
) -> None:
    """Rolling out: Budget only observes, so its call goes out; Planner's server refuses it with the
    transport's error (a JSON-RPC error, or HTTP 409), and Budget answers with what it has."""
    otel_guard.configure(cycle_rule="agent", keys=budget_observing.keys)
    planner, budget = budget_observing.planner, budget_observing.budget
    before = len(planner.executions()), len(budget.executions())

    answer = await ask(
        planner.url,
        "a 3-day Lisbon trip",
        "plan",
        binding=budget_observing.binding,
        streaming=budget_observing.streaming,
    )

    # Budget received Planner's refusal as an A2A error and answered with what it had.
    assert answer.startswith("plan: 3 days in Lisbon <price: 1200 EUR [A2ADelegationRefused: ")
    assert REFUSED_TEXT in answer
    assert [e["skill"] for e in planner.executions()[before[0] :]] == ["plan"]
    assert [e["skill"] for e in budget.executions()[before[1] :]] == ["price"]
    # Budget's process recorded what it would have refused, and let the call through...
    let_through = budget.hop_spans("invoke_agent planner", 1, **{"otel_guard.decision": "would_refuse"})
    assert let_through[-1]["kind"] == str(SpanKind.CLIENT)
    assert let_through[-1]["attributes"]["otel_guard.mode"] == "observe"
    events = [event["name"] for event in let_through[-1]["events"]]
    assert events[0] == "otel_guard.would_refuse"
    assert "exception" in events  # ... and the remote refusal it got back
    # ... and Planner's process refused it from the chain that came in over HTTP.
    refused = planner.hop_spans("invoke_agent planner", 1, **{"otel_guard.decision": "refuse"})
    assert refused[-1]["kind"] == str(SpanKind.INTERNAL)
    assert refused[-1]["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert [event["name"] for event in refused[-1]["events"]] == ["otel_guard.refused"]
