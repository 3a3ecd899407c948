"""LangGraph the way a user runs it: under ``opentelemetry-instrument``, configured by environment.

Two programs beside this file: ``langgraph_app.py`` (the planner/budget loop in one process) and
``langgraph_server_app.py`` (a stand-in LangGraph server on 127.0.0.1 that ``RemoteGraph`` calls).
Their spans come back through the console exporter on stdout.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from langgraph.pregel.remote import RemoteGraph
from langgraph_app import Script, ScriptedToolModel, agent_graph
from langgraph_sdk import get_client
from langgraph_server_app import remote_agent, remote_agent_tool
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import otel_guard
from otel_guard.chain import decode
from otel_guard.instrumentation.langgraph import LangGraphInstrumentor

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
REFUSAL_START = "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)"


def user_environment(**extra: str) -> dict[str, str]:
    """The environment of a user's run: SDK and guard configured by variables only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PYTEST_"))}
    env.update(
        OTEL_SERVICE_NAME="langgraph-app",
        OTEL_TRACES_EXPORTER="console",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_GUARD_CYCLE_RULE="agent",
    )
    env.update(extra)
    return env


def console_spans(text: str) -> list[dict[str, Any]]:
    """The spans the console exporter printed, among the program's own lines."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith(("RESULT ", "PORT ")))
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    position = 0
    while (start := body.find("{", position)) != -1:
        span, position = decoder.raw_decode(body, start)
        found.append(span)
    return found


def by_name(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    named = {span["name"]: span for span in spans}
    assert len(named) == len(spans), [span["name"] for span in spans]
    return named


# -- one process ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_loop_is_stopped_under_opentelemetry_instrument(mode: str) -> None:
    args = [str(BIN / "opentelemetry-instrument"), sys.executable, str(HERE / "langgraph_app.py")]
    if mode == "async":
        args.append("--async")
    done = subprocess.run(
        args, env=user_environment(), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["runs"] == {"planner": 1, "budget": 1}
    refusal, answer = result["tool_replies"]
    assert (refusal["agent"], refusal["tool"], refusal["status"]) == ("budget", "planner", "error")
    assert refusal["content"].startswith(REFUSAL_START)
    assert (answer["agent"], answer["tool"], answer["status"]) == ("planner", "budget", "success")
    assert REFUSAL_START in result["answer"]

    spans = by_name(console_spans(done.stdout))
    assert set(spans) == {"invoke_agent planner", "execute_tool budget", "execute_tool planner"}
    planner, budget, refused = (
        spans["invoke_agent planner"],
        spans["execute_tool budget"],
        spans["execute_tool planner"],
    )
    assert planner["attributes"]["otel_guard.chain.agents"] == ["planner"]
    assert budget["parent_id"] == planner["context"]["span_id"]
    assert refused["parent_id"] == budget["context"]["span_id"]
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert refused["attributes"]["otel_guard.decision"] == "refuse"
    assert refused["attributes"]["otel_guard.reason"] == "cycle"
    assert [event["name"] for event in refused["events"]] == ["otel_guard.refused"]


# -- across processes: RemoteGraph ----------------------------------------------------------------


class ServerProcess:
    """``langgraph_server_app.py`` under ``opentelemetry-instrument``, on a free port of 127.0.0.1."""

    def __init__(self, stderr: IO[str]) -> None:
        # stderr goes to a file: a pipe nobody reads until the end could fill up and stall the server.
        self._stderr = stderr
        self.process = subprocess.Popen(
            [
                str(BIN / "opentelemetry-instrument"),
                sys.executable,
                str(HERE / "langgraph_server_app.py"),
            ],
            env=user_environment(OTEL_SERVICE_NAME="langgraph-server"),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.stdout = ""
        self.url = f"http://127.0.0.1:{self._port()}"

    def _port(self) -> int:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else ""
        if not line.startswith("PORT "):
            self.process.kill()
            self.process.wait(timeout=10)
            pytest.fail(f"the server did not start: {line!r} {self.stderr()}")
        return int(line.split()[1])

    def script(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/script", timeout=10).json()  # type: ignore[no-any-return]

    def stop(self) -> list[dict[str, Any]]:
        """Stop the server (SIGTERM: it flushes its spans) and return the spans it exported."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate(timeout=10)
        self.stdout += out
        assert self.process.returncode == 0, self.stderr()
        return console_spans(self.stdout)

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = ServerProcess(stderr)
        try:
            yield process
        finally:
            if process.process.poll() is None:
                process.process.kill()
                process.process.wait(timeout=10)


@pytest.fixture
def instrumented() -> Iterator[None]:
    instrumentor = LangGraphInstrumentor()
    instrumentor.instrument()
    yield
    instrumentor.uninstrument()


def hex_id(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


def test_remote_budget_refuses_planner_when_planner_called_it_from_another_process(
    instrumented: None, server: ServerProcess, spans: Any
) -> None:
    # planner runs here; its tool "budget" is a RemoteGraph into the server, whose budget agent
    # offers "planner" as a tool: the hop budget -> planner is refused in the server.
    otel_guard.configure(cycle_rule="agent")
    script = Script(max_tool_calls=6)
    budget_tool = remote_agent_tool("budget", remote_agent("budget", server.url))
    planner = agent_graph("planner", ScriptedToolModel(agent="planner", script=script), [budget_tool])
    state = planner.invoke({"messages": [{"role": "user", "content": "Plan a trip to Lisbon."}]})

    answer = state["messages"][-1].content
    assert answer.startswith("planner answers with what it has. budget said: budget answers")
    assert REFUSAL_START in answer
    assert "planner is already in chain planner → budget" in answer
    assert script.runs == {"planner": 1}
    remote = server.script()
    assert remote["runs"] == {"budget": 1}  # the server's planner never ran
    (refusal,) = remote["tool_replies"]
    assert (refusal["agent"], refusal["tool"], refusal["status"]) == ("budget", "planner", "error")

    # The request carried the chain (planner -> budget, this process's root) and the trace.
    local_planner = spans.one("invoke_agent planner")
    local_budget = spans.one("execute_tool budget")
    root = local_planner.attributes["otel_guard.chain.root"]
    (carrier,) = remote["carriers"]
    name, _, token = carrier["baggage"].partition("=")
    assert name == "otel_guard.chain"
    chain = decode(token, None)
    assert [hop.agent for hop in chain.hops] == ["planner", "budget"]
    assert chain.root == root
    trace_id = local_planner.context.trace_id
    assert carrier["traceparent"].split("-")[1] == f"{trace_id:032x}"
    # The remote graph run inside the tool "budget" is that tool's hop: no second span here.
    assert not spans.named("invoke_agent budget")

    exported = by_name(server.stop())
    assert set(exported) == {"invoke_agent budget", "execute_tool planner"}
    budget, refused = exported["invoke_agent budget"], exported["execute_tool planner"]
    # budget was checked again in the server (receiving), not added twice.
    assert budget["attributes"]["otel_guard.chain.agents"] == ["planner", "budget"]
    assert budget["attributes"]["otel_guard.decision"] == "allow"
    assert budget["attributes"]["otel_guard.chain.root"] == root
    assert budget["context"]["trace_id"] == hex_id(trace_id, 32)
    assert budget["parent_id"] == hex_id(local_budget.context.span_id, 16)
    assert refused["attributes"]["otel_guard.chain.agents"] == ["planner", "budget", "planner"]
    assert refused["attributes"]["otel_guard.decision"] == "refuse"
    assert refused["attributes"]["otel_guard.reason"] == "cycle"
    assert refused["parent_id"] == budget["context"]["span_id"]


def client_span_checks(spans: Any, server: ServerProcess) -> ReadableSpan:
    client = spans.one("invoke_agent budget")
    assert client.kind is trace.SpanKind.CLIENT
    assert client.attributes["otel_guard.chain.agents"] == ("budget",)
    (carrier, *_) = server.script()["carriers"]
    assert carrier["traceparent"].split("-")[2] == f"{client.context.span_id:016x}"
    return client


def test_a_remote_graph_call_is_a_client_hop(instrumented: None, server: ServerProcess, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    state = remote_agent("budget", server.url).invoke(
        {"messages": [{"role": "user", "content": "What does Lisbon cost?"}]}
    )
    # budget -> planner -> budget: the second hop into budget is refused inside the server.
    assert "budget is already in chain budget → planner" in state["messages"][-1]["content"]
    assert server.script()["runs"] == {"budget": 1, "planner": 1}
    client = client_span_checks(spans, server)
    exported = server.stop()
    received = [s for s in exported if s["name"] == "invoke_agent budget"]
    assert [s["attributes"]["otel_guard.chain.agents"] for s in received] == [["budget"]]
    assert received[0]["parent_id"] == hex_id(client.context.span_id, 16)


async def test_an_async_remote_graph_call_is_a_client_hop(
    instrumented: None, server: ServerProcess, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    remote = RemoteGraph("budget", client=get_client(url=server.url, api_key=None, timeout=30))
    state = await remote.ainvoke({"messages": [{"role": "user", "content": "Costs?"}]})
    assert "budget is already in chain budget → planner" in state["messages"][-1]["content"]
    client_span_checks(spans, server)


def test_a_remote_graph_refused_here_sends_no_request(
    instrumented: None, server: ServerProcess, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    with (
        otel_guard.delegate("budget"),
        otel_guard.delegate("helper"),
        pytest.raises(otel_guard.DelegationRefused),
    ):
        remote_agent("budget", server.url).invoke({"messages": []})
    assert server.script()["carriers"] == []
    refused = [s for s in spans.named("invoke_agent budget") if s.kind is trace.SpanKind.CLIENT]
    assert [s.attributes["otel_guard.decision"] for s in refused] == ["refuse"]


def test_the_chain_travels_with_your_headers_and_without_a_baggage_propagator(
    instrumented: None, server: ServerProcess, spans: Any
) -> None:
    otel_guard.configure(cycle_rule="agent")
    previous = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())
    try:
        remote_agent("budget", server.url).invoke(
            {"messages": [{"role": "user", "content": "Costs?"}]},
            headers={"Baggage": "tenant=acme"},
        )
    finally:
        propagate.set_global_textmap(previous)
    (carrier, *_) = server.script()["carriers"]
    tenant, chain_member = carrier["baggage"].split(",")
    assert tenant == "tenant=acme"
    name, _, token = chain_member.partition("=")
    assert name == "otel_guard.chain"
    assert [hop.agent for hop in decode(token, None).hops] == ["budget"]
    client = spans.one("invoke_agent budget")
    assert carrier["traceparent"].split("-")[2] == f"{client.context.span_id:016x}"
