"""Two agents asking each other, traced by an LLM observability SDK's own decorators, as it exports them.

Records ``corpus/vendors/``: the SDK writes OpenTelemetry spans and exports them over OTLP/HTTP to
a receiver this program runs on 127.0.0.1 (no account, no other host); the spans are written as
they arrived, one JSON line each (the format of ``corpus/README.md``), decoded from the SDK's own
export requests. VENDOR (each in its own environment, .venv-vendors-<name> at the repository's top,
made by scripts/bootstrap-vendors from ``requirements-vendors-<name>.txt`` beside this file):

- ``langfuse``: ``@observe(as_type="agent" / "tool" / "generation")``, its exporter's base URL here;
- ``mlflow``: ``@mlflow.trace(span_type=SpanType.AGENT / TOOL / LLM)``, mlflow's OTLP export
  (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) instead of a tracking server;
- ``logfire``: ``logfire.span("agent {agent_name}")`` and ``@logfire.instrument("tool {tool}")``
  (message-template span names, the name in an attribute), ``send_to_logfire=False``, its OTLP
  export to the receiver;
- ``phoenix``: arize-phoenix-otel's ``register()`` tracer, ``@tracer.agent`` / ``@tracer.tool`` /
  ``@tracer.llm`` (OpenInference kinds);
- ``agentops``: ``@agent`` / ``@tool`` / ``@operation`` (its OTel tracer), exporter here;
- ``lmnr``: Laminar's ``@observe(span_type=...)``, its OTLP export here;
- ``logfire_openai_agents``, ``mlflow_openai_agents``, ``langfuse_openai_agents``,
  ``phoenix_openai_agents``, ``agentops_openai_agents``, ``lmnr_openai_agents``: each SDK's
  integration with the OpenAI Agents SDK (openai-agents 0.24.0 in the same environment; Langfuse's
  and Phoenix's documented path is OpenInference's instrumentor), planner and budget each the other's
  tool on the offline ``LoopModel`` of tests/instrumentation/openai_agents;
- ``logfire_pydantic_ai``, ``mlflow_pydantic_ai``: ``logfire.instrument_pydantic_ai()``,
  ``mlflow.pydantic_ai.autolog()``, on pydantic-ai's ``FunctionModel`` (tests/instrumentation/pydantic_ai);
- ``mlflow_langgraph``, ``langfuse_langgraph``, ``lmnr_langgraph``: ``mlflow.langchain.autolog()``,
  Langfuse's LangChain ``CallbackHandler``, Laminar's instrumentors, on LangGraph with the scripted
  chat model of tests/instrumentation/langgraph.

The "model" is scripted: each agent run asks the model (a generation span where the SDK has one),
which answers with a tool call while the scenario's tool calls last. SCENARIO ``loop``: planner ->
budget -> planner -> ... (5 tool calls); ``control``: planner asks budget once, budget answers.
Run from this folder::

    for s in loop control; do
      /work/main/.venv-vendors-langfuse/bin/python record_vendor.py \
        langfuse $s corpus/vendors/langfuse.$s.spans.jsonl
    done

``--same-names`` (the LangGraph programs): the tools named like the agents they run, ``budget`` and
``planner``, instead of ``ask_budget`` and ``ask_planner``. It prints ``RESULT {json}``: the tool
calls made and the spans received.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

LOOP_TOOL_CALLS = 5
KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
MAX_VALUE_CHARS = 300


def value_of(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value[:MAX_VALUE_CHARS]
    if which in ("int_value", "bool_value", "double_value"):
        return getattr(value, which)
    if which == "array_value":
        return [value_of(item) for item in value.array_value.values]
    return None if which is None else str(getattr(value, which))[:MAX_VALUE_CHARS]


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on 127.0.0.1 that keeps every span it is sent, as records."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.records: list[dict[str, Any]] = []
        self.paths: set[str] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def keep(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.records.append(
                            {
                                "name": span.name,
                                "kind": KINDS.get(span.kind, str(span.kind)),
                                "scope": scope_spans.scope.name,
                                "scope_version": scope_spans.scope.version,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex() or None,
                                "links": len(span.links),
                                "start": span.start_time_unix_nano,
                                "attributes": {a.key: value_of(a.value) for a in span.attributes},
                            }
                        )


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.server.paths.add(self.path)
        if self.path.endswith("/v1/traces"):
            request = ExportTraceServiceRequest()
            if "json" in (self.headers.get("Content-Type") or ""):
                Parse(body, request)
            else:
                request.ParseFromString(body)
            self.server.keep(request)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self) -> None:
        self.server.paths.add(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Script:
    """The scripted model: a tool call while the scenario's calls last, then an answer."""

    def __init__(self, calls: int, same_names: bool = False) -> None:
        self.left = calls
        self.made = 0
        self.same_names = same_names  # the tools named like the agents they run (LangGraph's only)

    def decide(self, agent: str) -> str | None:
        if self.left <= 0:
            return None
        self.left -= 1
        self.made += 1
        return "budget" if agent == "planner" else "planner"


Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def program(
    script: Script, agent: Callable[[str], Wrap], tool: Callable[[str], Wrap], model: Wrap
) -> Callable[[], str]:
    """planner and budget, each an agent that asks the model and calls the other through a tool."""
    agents: dict[str, Callable[[str], str]] = {}

    @model
    def ask_model(agent_name: str, question: str) -> str | None:
        return script.decide(agent_name)

    def make(name: str) -> None:
        @agent(name)
        def run(question: str) -> str:
            other = ask_model(name, question)
            if other is None:
                return f"{name}: done"
            return tools[other](f"from {name}")

        agents[name] = run

    tools: dict[str, Callable[[str], str]] = {}

    def make_tool(callee: str) -> None:
        @tool(f"ask_{callee}")
        def ask(question: str) -> str:
            return agents[callee](question)

        tools[callee] = ask

    for name in ("planner", "budget"):
        make(name)
        make_tool(name)
    return lambda: agents["planner"]("plan the trip")


def run_langfuse(receiver: Receiver, script: Script) -> None:
    from langfuse import Langfuse, observe

    client = Langfuse(public_key="pk-lf-local", secret_key="sk-lf-local", base_url=receiver.url, flush_at=1)
    main = program(
        script,
        agent=lambda name: observe(name=name, as_type="agent"),
        tool=lambda name: observe(name=name, as_type="tool"),
        model=observe(name="model", as_type="generation"),
    )
    main()
    client.flush()
    client.shutdown()


def run_mlflow(receiver: Receiver, script: Script) -> None:
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    os.environ["MLFLOW_TRACKING_URI"] = receiver.url  # no tracking server: the spans go over OTLP
    import mlflow
    from mlflow.entities import SpanType

    main = program(
        script,
        agent=lambda name: mlflow.trace(name=name, span_type=SpanType.AGENT),
        tool=lambda name: mlflow.trace(name=name, span_type=SpanType.TOOL),
        model=mlflow.trace(name="model", span_type=SpanType.LLM),
    )
    main()
    from mlflow.tracing.provider import provider  # mlflow's own tracer provider

    provider.get().force_flush()


def run_logfire(receiver: Receiver, script: Script) -> None:
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    import logfire

    logfire.configure(send_to_logfire=False, console=False, service_name="vendors")

    def agent(name: str) -> Wrap:
        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any) -> Any:
                with logfire.span("agent {agent_name}", agent_name=name):
                    return function(*args)

            return run

        return wrap

    def tool(name: str) -> Wrap:
        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            def run(question: str) -> Any:
                return called(name, question)

            @logfire.instrument("tool {tool}", extract_args=True)
            def called(tool: str, question: str) -> Any:
                return function(question)

            return run

        return wrap

    main = program(script, agent=agent, tool=tool, model=logfire.instrument("model call", extract_args=False))
    main()
    logfire.force_flush()


def run_phoenix(receiver: Receiver, script: Script) -> None:
    from phoenix.otel import register

    provider = register(
        project_name="vendors", endpoint=f"{receiver.url}/v1/traces", protocol="http/protobuf", batch=False
    )
    tracer = provider.get_tracer("vendors")

    main = program(
        script,
        agent=lambda name: tracer.agent(name=name),
        tool=lambda name: tracer.tool(name=name),
        model=tracer.llm(name="model"),
    )
    main()
    provider.force_flush()


def run_agentops(receiver: Receiver, script: Script) -> None:
    import agentops
    from agentops.sdk.decorators import agent, operation, tool

    agentops.init(
        api_key="00000000-0000-0000-0000-000000000000",
        endpoint=receiver.url,
        app_url=receiver.url,
        exporter_endpoint=f"{receiver.url}/v1/traces",
        auto_start_session=False,
        instrument_llm_calls=False,
    )
    main = program(
        script,
        agent=lambda name: agent(name=name),
        tool=lambda name: tool(name=name),
        model=operation(name="model"),
    )
    main()
    from opentelemetry import trace

    getattr(trace.get_tracer_provider(), "force_flush", lambda: None)()


def run_lmnr(receiver: Receiver, script: Script) -> None:
    from lmnr import Laminar, observe

    port = receiver.server_address[1]
    Laminar.initialize(
        project_api_key="local",
        base_url="http://127.0.0.1",
        http_port=port,
        force_http=True,
        disable_batch=True,
    )
    main = program(
        script,
        agent=lambda name: observe(name=name, span_type="DEFAULT"),
        tool=lambda name: observe(name=name, span_type="TOOL"),
        model=observe(name="model", span_type="LLM"),
    )
    main()
    Laminar.flush()


def instrumentation_tests(runtime: str) -> None:
    """Make the offline programs of tests/instrumentation/RUNTIME importable."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "instrumentation" / runtime))


def openai_agents_loop(script: Script) -> None:
    """planner and budget as OpenAI Agents SDK agents, each the other's tool, on the offline
    ``LoopModel`` of tests/instrumentation/openai_agents (openai-agents 0.24.0)."""
    instrumentation_tests("openai_agents")
    os.environ.pop("OPENAI_API_KEY", None)  # an SDK's processor left in place exports nothing then
    from agents import Agent, Runner
    from openai_agents_models import CallBudget, LoopModel

    calls = CallBudget(script.left)
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget = Agent(name="budget", instructions="Price the plan.")
    planner.model = LoopModel("planner", "ask_budget", calls)
    budget.model = LoopModel("budget", "ask_planner", calls)
    planner.tools = [budget.as_tool("ask_budget", "Ask the budget agent.")]
    budget.tools = [planner.as_tool("ask_planner", "Ask the planner agent.")]
    Runner.run_sync(planner, "Plan a trip to Lisbon.")
    script.made, script.left = calls.made, calls.left


def run_logfire_openai_agents(receiver: Receiver, script: Script) -> None:
    """Logfire's integration with the OpenAI Agents SDK (``logfire.instrument_openai_agents()``)."""
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    import logfire
    from agents import set_trace_processors

    set_trace_processors([])  # nothing to the SDK's default exporter (api.openai.com)
    logfire.configure(send_to_logfire=False, console=False, service_name="vendors")
    logfire.instrument_openai_agents()
    openai_agents_loop(script)
    logfire.force_flush()


def run_mlflow_openai_agents(receiver: Receiver, script: Script) -> None:
    """MLflow's integration with the OpenAI Agents SDK (``mlflow.openai.autolog()``), over OTLP."""
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    os.environ["MLFLOW_TRACKING_URI"] = receiver.url
    import mlflow
    from agents import set_trace_processors

    set_trace_processors([])
    mlflow.openai.autolog()
    openai_agents_loop(script)
    from mlflow.tracing.provider import provider

    provider.get().force_flush()


def run_langfuse_openai_agents(receiver: Receiver, script: Script) -> None:
    """Langfuse's documented path for the OpenAI Agents SDK: OpenInference's instrumentor, its spans
    exported by the Langfuse client's span processor (the client sets the global tracer provider)."""
    from agents import set_trace_processors
    from langfuse import Langfuse
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    client = Langfuse(public_key="pk-lf-local", secret_key="sk-lf-local", base_url=receiver.url, flush_at=1)
    set_trace_processors([])  # nothing to the SDK's default exporter (api.openai.com)
    OpenAIAgentsInstrumentor().instrument()
    openai_agents_loop(script)
    client.flush()
    client.shutdown()


def run_phoenix_openai_agents(receiver: Receiver, script: Script) -> None:
    """Phoenix's documented path: ``register(auto_instrument=True)`` instruments the OpenAI Agents
    SDK with the OpenInference instrumentor installed beside it."""
    from agents import set_trace_processors
    from phoenix.otel import register

    set_trace_processors([])
    provider = register(
        project_name="vendors",
        endpoint=f"{receiver.url}/v1/traces",
        protocol="http/protobuf",
        batch=False,
        auto_instrument=True,
    )
    openai_agents_loop(script)
    provider.force_flush()


def run_agentops_openai_agents(receiver: Receiver, script: Script) -> None:
    """AgentOps' own instrumentor for the OpenAI Agents SDK (``agentops.init()`` instruments the SDK;
    its trace processor replaces the SDK's default one). The SDK is imported first, as AgentOps'
    examples do: instrumented from AgentOps' import hook, agents 0.24.0 is still half-imported and
    the instrumentor fails (``cannot import name 'set_trace_processors'``), and nothing is traced."""
    import agents  # noqa: F401  (before agentops.init(): see above)

    # isort: split
    import agentops

    agentops.init(
        api_key="00000000-0000-0000-0000-000000000000",
        endpoint=receiver.url,
        app_url=receiver.url,
        exporter_endpoint=f"{receiver.url}/v1/traces",
        auto_start_session=False,
    )
    openai_agents_loop(script)
    from opentelemetry import trace

    getattr(trace.get_tracer_provider(), "force_flush", lambda: None)()


def run_lmnr_langgraph(receiver: Receiver, script: Script) -> None:
    """Laminar's own LangChain and LangGraph instrumentors (``Laminar.initialize()``)."""
    from lmnr import Laminar

    Laminar.initialize(
        project_api_key="local",
        base_url="http://127.0.0.1",
        http_port=receiver.server_address[1],
        force_http=True,
        disable_batch=True,
    )
    langgraph_loop(script)
    Laminar.flush()


def run_lmnr_openai_agents(receiver: Receiver, script: Script) -> None:
    """Laminar's own instrumentor for the OpenAI Agents SDK (``Laminar.initialize()`` instruments
    every library it supports that is installed)."""
    from lmnr import Laminar

    Laminar.initialize(
        project_api_key="local",
        base_url="http://127.0.0.1",
        http_port=receiver.server_address[1],
        force_http=True,
        disable_batch=True,
    )
    openai_agents_loop(script)
    Laminar.flush()


def pydantic_ai_loop(script: Script) -> None:
    """planner and budget as pydantic-ai agents, each the other's tool, on pydantic-ai's offline
    ``FunctionModel`` (the ``build_loop`` of tests/instrumentation/pydantic_ai)."""
    instrumentation_tests("pydantic_ai")
    from pydantic_ai_app import build_loop

    loop = build_loop(planner_tool="ask_budget", budget_tool="ask_planner")
    loop.planner_model.max_tool_calls = (script.left + 1) // 2  # planner -> budget first, and last
    loop.budget_model.max_tool_calls = script.left // 2
    loop.planner.run_sync("Plan the team offsite")
    script.made = loop.planner_model.tool_calls + loop.budget_model.tool_calls
    script.left -= script.made


def run_logfire_pydantic_ai(receiver: Receiver, script: Script) -> None:
    """Logfire's integration with pydantic-ai (``logfire.instrument_pydantic_ai()``)."""
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    import logfire

    logfire.configure(send_to_logfire=False, console=False, service_name="vendors")
    logfire.instrument_pydantic_ai()
    pydantic_ai_loop(script)
    logfire.force_flush()


def run_mlflow_pydantic_ai(receiver: Receiver, script: Script) -> None:
    """MLflow's integration with pydantic-ai (``mlflow.pydantic_ai.autolog()``), over OTLP."""
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    os.environ["MLFLOW_TRACKING_URI"] = receiver.url
    import mlflow

    mlflow.pydantic_ai.autolog()
    pydantic_ai_loop(script)
    from mlflow.tracing.provider import provider

    provider.get().force_flush()


def langgraph_loop(script: Script, config: dict[str, Any] | None = None) -> None:
    """planner and budget as LangGraph ``StateGraph``\\ s, each the other's tool, on the scripted
    chat model of tests/instrumentation/langgraph (``config``: the top graph's run config)."""
    instrumentation_tests("langgraph")
    from langchain_core.messages import HumanMessage
    from langgraph_app import Script as GraphScript
    from langgraph_app import delegation_loop

    calls = GraphScript(max_tool_calls=script.left)
    names = {} if script.same_names else {"budget": "ask_budget", "planner": "ask_planner"}
    graphs = delegation_loop(calls, tool_names=names)
    graphs["planner"].invoke({"messages": [HumanMessage("Plan a three-day trip to Lisbon.")]}, config)
    script.made, script.left = calls.tool_calls, script.left - calls.tool_calls


def run_langfuse_langgraph(receiver: Receiver, script: Script) -> None:
    """Langfuse's LangChain integration: its ``CallbackHandler`` in the top graph's run config (the
    graphs the tools run inherit it), the spans exported by the Langfuse client."""
    from langfuse import Langfuse
    from langfuse.langchain import CallbackHandler

    client = Langfuse(public_key="pk-lf-local", secret_key="sk-lf-local", base_url=receiver.url, flush_at=1)
    langgraph_loop(script, {"callbacks": [CallbackHandler()]})
    client.flush()
    client.shutdown()


def run_mlflow_langgraph(receiver: Receiver, script: Script) -> None:
    """MLflow's integration with LangChain (``mlflow.langchain.autolog()``), over OTLP."""
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{receiver.url}/v1/traces"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    os.environ["MLFLOW_TRACKING_URI"] = receiver.url
    import mlflow

    mlflow.langchain.autolog()
    langgraph_loop(script)
    from mlflow.tracing.provider import provider

    provider.get().force_flush()


VENDORS: dict[str, Callable[[Receiver, Script], None]] = {
    "logfire_pydantic_ai": run_logfire_pydantic_ai,
    "mlflow_langgraph": run_mlflow_langgraph,
    "langfuse_langgraph": run_langfuse_langgraph,
    "lmnr_langgraph": run_lmnr_langgraph,
    "mlflow_pydantic_ai": run_mlflow_pydantic_ai,
    "langfuse_openai_agents": run_langfuse_openai_agents,
    "phoenix_openai_agents": run_phoenix_openai_agents,
    "agentops_openai_agents": run_agentops_openai_agents,
    "lmnr_openai_agents": run_lmnr_openai_agents,
    "logfire_openai_agents": run_logfire_openai_agents,
    "mlflow_openai_agents": run_mlflow_openai_agents,
    "langfuse": run_langfuse,
    "mlflow": run_mlflow,
    "logfire": run_logfire,
    "phoenix": run_phoenix,
    "agentops": run_agentops,
    "lmnr": run_lmnr,
}


def main() -> None:
    vendor, scenario, path = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    os.environ.setdefault("AGENTOPS_LOGGING_TO_FILE", "false")  # no agentops.log where it runs
    receiver = Receiver()
    script = Script(LOOP_TOOL_CALLS if scenario == "loop" else 1, "--same-names" in sys.argv)
    VENDORS[vendor](receiver, script)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the last export may still be on its way
        count = len(receiver.records)
        time.sleep(0.5)
        if count and len(receiver.records) == count:
            break
    with open(path, "w", encoding="utf-8") as out:
        for record in receiver.records:
            out.write(json.dumps(record) + "\n")
    result = {"tool_calls": script.made, "spans": len(receiver.records), "paths": sorted(receiver.paths)}
    print("RESULT " + json.dumps(result), flush=True)
    receiver.shutdown()


if __name__ == "__main__":
    main()
