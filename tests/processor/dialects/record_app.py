"""Two agents delegating through tools, traced by a real third-party instrumentation, nothing of ours.

The programs the dialect tests run, one per (runtime, instrumentation): ``planner`` and ``budget``,
each with a tool that runs the other, driven by the runtimes' own offline test models (pydantic-ai's
``FunctionModel``, the OpenAI Agents SDK's ``agents.testing.ScriptedModel``, a LangChain chat model
that scripts its tool calls). The spans are exported over OTLP/gRPC to ``OTEL_EXPORTER_OTLP_ENDPOINT``
(the processor under test), or written as JSON lines with ``--jsonl PATH`` (the format of
``shared/corpus/genai-traces``)::

    python record_app.py RUNTIME INSTRUMENTATION SCENARIO [--same-names] [--jsonl PATH]

- RUNTIME: ``pydantic_ai``, ``openai_agents`` or ``langgraph``;
- INSTRUMENTATION: ``builtin`` (pydantic-ai's ``Agent.instrument_all()``), ``openinference``,
  ``otel_v2`` (opentelemetry-instrumentation-openai-agents-v2) or ``traceloop``
  (opentelemetry-instrumentation-langchain);
- SCENARIO: ``loop`` (planner -> budget -> planner -> ..., ended by the scripted models after
  ``LOOP_TOOL_CALLS`` tool calls) or ``control`` (planner asks budget once, budget answers);
- ``--same-names``: the tools are named like the agents they run (``budget``, ``planner``) instead of
  ``ask_budget`` / ``ask_planner``;
- ``--guard``: otel-guard's instrumentor for the runtime as well, beside the third-party one, with
  its settings from the environment (``OTEL_GUARD_*``).

It prints one line ``RESULT {json}`` with how many tool calls the models made.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

# The runtimes' offline test models, beside their tests (tests/instrumentation/<runtime>/).
_TESTS = Path(__file__).resolve().parents[2] / "instrumentation"
sys.path[:0] = [str(_TESTS / runtime) for runtime in ("pydantic_ai", "openai_agents", "langgraph")]

LOOP_TOOL_CALLS = 5


class JsonLinesExporter(SpanExporter):
    """Spans as JSON lines, one object per span, in the format of the shared corpus."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed at shutdown)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            context = span.get_span_context()
            record = {
                "name": span.name,
                "kind": span.kind.name,
                "scope": span.instrumentation_scope.name if span.instrumentation_scope else "",
                "scope_version": span.instrumentation_scope.version if span.instrumentation_scope else "",
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
                "links": len(span.links),
                "start": span.start_time,
                "end": span.end_time,
                # (None: a value the SDK kept that the OTLP exporter drops, as it cannot encode it)
                "attributes": {k: _short(v) for k, v in (span.attributes or {}).items() if v is not None},
            }
            self._file.write(json.dumps(record) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._file.close()


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 300:
        return value[:300] + f"...({len(value)} chars)"
    return list(value) if isinstance(value, tuple) else value


def tracer_provider(jsonl: str | None) -> TracerProvider:
    provider = TracerProvider()
    if jsonl:
        exporter: SpanExporter = JsonLinesExporter(jsonl)
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"], insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def tool_names(same_names: bool) -> tuple[str, str]:
    """The planner's tool (which runs budget) and budget's tool (which runs planner)."""
    return ("budget", "planner") if same_names else ("ask_budget", "ask_planner")


def guard(runtime: str) -> None:
    """Instrument ``runtime`` with otel-guard too (its settings from the environment)."""
    from otel_guard.instrumentation.langgraph import LangGraphInstrumentor
    from otel_guard.instrumentation.openai_agents import OpenAIAgentsInstrumentor
    from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor

    instrumentors = {
        "pydantic_ai": PydanticAIInstrumentor,
        "openai_agents": OpenAIAgentsInstrumentor,
        "langgraph": LangGraphInstrumentor,
    }
    instrumentors[runtime]().instrument()


def run_pydantic_ai(instrumentation: str, scenario: str, same_names: bool, provider: TracerProvider) -> int:
    from pydantic_ai import Agent
    from pydantic_ai_app import build_loop

    if instrumentation == "openinference":
        from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor

        provider.add_span_processor(OpenInferenceSpanProcessor())
    elif instrumentation != "builtin":
        raise SystemExit(f"pydantic_ai has no instrumentation {instrumentation!r} here")
    Agent.instrument_all()
    planner_tool, budget_tool = tool_names(same_names)
    loop = build_loop(planner_tool=planner_tool, budget_tool=budget_tool, max_tool_calls=LOOP_TOOL_CALLS)
    if scenario == "loop":
        loop.planner_model.max_tool_calls = (LOOP_TOOL_CALLS + 1) // 2
        loop.budget_model.max_tool_calls = LOOP_TOOL_CALLS // 2
    else:
        loop.planner_model.max_tool_calls, loop.budget_model.max_tool_calls = 1, 0
    loop.planner.run_sync("Plan the team offsite")
    return loop.planner_model.tool_calls + loop.budget_model.tool_calls


def run_openai_agents(instrumentation: str, scenario: str, same_names: bool) -> int:
    from agents import Agent, Runner, set_trace_processors
    from openai_agents_models import CallBudget, LoopModel

    # Nothing may reach the SDK's default exporter (api.openai.com): the instrumentation's
    # processor is the only one.
    set_trace_processors([])
    if instrumentation == "openinference":
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        OpenAIAgentsInstrumentor().instrument()
    elif instrumentation == "otel_v2":
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor as V2

        V2().instrument()
    else:
        raise SystemExit(f"openai_agents has no instrumentation {instrumentation!r} here")
    calls = CallBudget(LOOP_TOOL_CALLS if scenario == "loop" else 1)
    planner_tool, budget_tool = tool_names(same_names)
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget = Agent(name="budget", instructions="Price the plan.")
    planner.model = LoopModel("planner", planner_tool, calls)
    budget.model = LoopModel("budget", budget_tool, calls)
    planner.tools = [budget.as_tool(planner_tool, "Ask the budget agent.")]
    budget.tools = [planner.as_tool(budget_tool, "Ask the planner agent.")]
    Runner.run_sync(planner, "Plan a trip to Lisbon.")
    return calls.made


def run_langgraph(instrumentation: str, scenario: str, same_names: bool) -> int:
    from langchain_core.messages import HumanMessage
    from langgraph_app import Script, delegation_loop

    if instrumentation == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument()
    elif instrumentation == "traceloop":
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        LangchainInstrumentor().instrument()
    else:
        raise SystemExit(f"langgraph has no instrumentation {instrumentation!r} here")
    script = Script(max_tool_calls=LOOP_TOOL_CALLS if scenario == "loop" else 1)
    planner_tool, budget_tool = tool_names(same_names)
    graphs = delegation_loop(script, tool_names={"budget": planner_tool, "planner": budget_tool})
    graphs["planner"].invoke({"messages": [HumanMessage("Plan a three-day trip to Lisbon.")]})
    return script.tool_calls


def main(argv: list[str]) -> None:
    jsonl = None
    if "--jsonl" in argv:
        at = argv.index("--jsonl")
        jsonl = argv[at + 1]
        del argv[at : at + 2]
    same_names = "--same-names" in argv
    runtime, instrumentation, scenario = [a for a in argv if not a.startswith("--")]
    if scenario not in ("loop", "control"):
        raise SystemExit(f"unknown scenario {scenario!r}")
    provider = tracer_provider(jsonl)
    if "--guard" in argv:
        guard(runtime)
    if runtime == "pydantic_ai":
        calls = run_pydantic_ai(instrumentation, scenario, same_names, provider)
    elif runtime == "openai_agents":
        calls = run_openai_agents(instrumentation, scenario, same_names)
    elif runtime == "langgraph":
        calls = run_langgraph(instrumentation, scenario, same_names)
    else:
        raise SystemExit(f"unknown runtime {runtime!r}")
    provider.shutdown()
    print("RESULT " + json.dumps({"tool_calls": calls}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
