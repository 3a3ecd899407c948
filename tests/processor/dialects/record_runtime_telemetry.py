"""Two agents asking each other, traced only by their runtime's own telemetry or its OpenLLMetry package.

Records the ``corpus/runtimes/`` fixtures: runtimes whose spans the processor must read with nothing of
otel-guard's in the process (``record_app.py`` records the third-party instrumentations):

- ``google_adk``: Google ADK's own OpenTelemetry spans (google-adk 2.13.0, opentelemetry-sdk
  1.44.0), planner and budget as ``AgentTool``\\ s of each other, driven by the offline
  ``ScriptedModel`` of ``tests/runtimes/google_adk``. Run in ``.venv-runtimes/google-adk``.
- ``crewai_openllmetry``: CrewAI 1.15.30 under ``opentelemetry-instrumentation-crewai`` 0.62.4
  (OpenLLMetry; opentelemetry-sdk 1.45.2), planner and budget each with a tool whose body runs a
  one-task crew of a new agent of the other role (the instrumentation traces crews, tasks and an
  agent's task run, not a standalone ``Agent.kickoff``; and one Agent object cannot run again inside
  its own run), driven by the offline ``ScriptedLLM`` of ``tests/runtimes/crewai`` (CrewAI's
  telemetry off, and checked to reach no other host). CrewAI's tool calls make no span. Run in a
  throwaway environment::

      python3 -m venv /tmp/venv-crewai-oll
      /tmp/venv-crewai-oll/bin/pip install 'crewai==1.15.30' 'opentelemetry-instrumentation-crewai==0.62.4'

SCENARIO ``loop``: planner -> budget -> planner -> ... (``LOOP_TOOL_CALLS`` tool calls in all, the
scripted models' own limit); ``control``: planner asks budget once and budget answers. The spans
are kept by an in-memory exporter and written as JSON lines (the format of ``corpus/README.md``),
in the order they ended, into ``corpus/runtimes/``: apart from ``corpus/``, whose every recording
``test_corpus.py`` expects the detector to count right, which it does not do of these yet (the
reference of ``tests/processor/reference`` does). Re-record from this folder::

    for s in loop control; do
      ../../../.venv-runtimes/google-adk/bin/python record_runtime_telemetry.py \
        google_adk $s corpus/runtimes/adk.$s.spans.jsonl
      /tmp/venv-crewai-oll/bin/python record_runtime_telemetry.py \
        crewai_openllmetry $s corpus/runtimes/crewai_tl.$s.spans.jsonl
    done

It prints one line ``RESULT {json}`` with how many tool calls the models made.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from record_app import JsonLinesExporter

RUNTIMES = Path(__file__).resolve().parents[2] / "runtimes"
LOOP_TOOL_CALLS = 5  # planner -> budget three times, budget -> planner twice


def run_google_adk(scenario: str) -> int:
    sys.path.insert(0, str(RUNTIMES / "google_adk"))
    from google_adk_models import agents_as_tools, run

    pair = agents_as_tools(max_tool_calls=LOOP_TOOL_CALLS if scenario == "loop" else 1)
    asyncio.run(run(pair.planner))
    return LOOP_TOOL_CALLS - pair.tool_calls.left if scenario == "loop" else 1 - pair.tool_calls.left


def run_crewai_openllmetry(scenario: str) -> int:
    # CrewAI's own telemetry and trace collection off, its files in a temporary folder.
    os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
    os.environ["CREWAI_TRACING_ENABLED"] = "false"
    os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="record-crewai-")
    os.environ["TRACELOOP_METRICS_ENABLED"] = "false"
    sys.path.insert(0, str(RUNTIMES / "crewai"))
    from opentelemetry.instrumentation.crewai import CrewAIInstrumentor

    CrewAIInstrumentor().instrument()
    from crewai import Crew, Task
    from crewai.events.event_listener import event_listener
    from crewai.tools import BaseTool
    from crewai_app import Question, ScriptedLLM, agent
    from crewai_offline import watch_network
    from pydantic import BaseModel

    class CrewOf(BaseTool):
        """A tool whose body runs a crew of one task for a new agent of ``role``, with ``model``."""

        args_schema: type[BaseModel] = Question
        role: str = ""
        model: Any = None
        tools: Any = None
        calls: int = 0

        def _run(self, question: str, **kwargs: Any) -> str:
            self.calls += 1
            runner = agent(self.role, self.model, self.tools)
            task = Task(description=f"Answer {question}", expected_output="An answer", agent=runner)
            return str(Crew(agents=[runner], tasks=[task], verbose=False).kickoff().raw)

    external = watch_network()
    event_listener.formatter.verbose = False
    loop = scenario == "loop"
    planner_model = ScriptedLLM(
        model="scripted",
        agent="planner",
        tool="ask_budget",
        max_tool_calls=(LOOP_TOOL_CALLS + 1) // 2 if loop else 1,
    )
    budget_model = ScriptedLLM(
        model="scripted",
        agent="budget",
        tool="ask_planner",
        max_tool_calls=LOOP_TOOL_CALLS // 2 if loop else 0,
    )
    ask_budget = CrewOf(
        name="ask_budget", description="Ask the budget agent.", role="budget", model=budget_model
    )
    ask_planner = CrewOf(
        name="ask_planner", description="Ask the planner agent.", role="planner", model=planner_model
    )
    ask_budget.tools, ask_planner.tools = [ask_planner], [ask_budget]
    planner = agent("planner", planner_model, [ask_budget])
    task = Task(description="Plan the team offsite", expected_output="A plan", agent=planner)
    Crew(agents=[planner], tasks=[task], verbose=False).kickoff()
    assert external == [], f"the run reached beyond this host: {external}"
    return ask_budget.calls + ask_planner.calls


def main(argv: list[str]) -> None:
    runtime, scenario, jsonl = argv
    if scenario not in ("loop", "control"):
        raise SystemExit(f"unknown scenario {scenario!r}")
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    if runtime == "google_adk":
        calls = run_google_adk(scenario)
    elif runtime == "crewai_openllmetry":
        calls = run_crewai_openllmetry(scenario)
    else:
        raise SystemExit(f"unknown runtime {runtime!r}")
    provider.force_flush()
    writer = JsonLinesExporter(jsonl)
    writer.export(memory.get_finished_spans())
    writer.shutdown()
    print("RESULT " + json.dumps({"tool_calls": calls}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
