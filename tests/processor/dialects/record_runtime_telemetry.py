"""Two agents asking each other, traced only by their runtime's own telemetry or by one instrumentation.

Records the ``corpus/runtimes/`` fixtures: runtimes whose spans the processor must read with nothing of
otel-guard's in the process, that the old detector never read (``record_app.py`` records the others):

- ``google_adk``: Google ADK's own OpenTelemetry spans (google-adk 2.13.0, opentelemetry-sdk
  1.44.0), planner and budget as ``AgentTool``\\ s of each other, driven by the offline
  ``ScriptedModel`` of ``tests/instrumentation/google_adk``. Run in ``.venv-runtimes/google-adk``.
- ``crewai_openllmetry``: CrewAI 1.15.30 under ``opentelemetry-instrumentation-crewai`` 0.62.4
  (OpenLLMetry; opentelemetry-sdk 1.45.2), planner and budget each with a tool whose body runs a
  one-task crew of a new agent of the other role (the instrumentation traces crews, tasks and an
  agent's task run, not a standalone ``Agent.kickoff``; and one Agent object cannot run again inside
  its own run), driven by the offline ``ScriptedLLM`` of ``tests/instrumentation/crewai`` (CrewAI's
  telemetry off, and checked to reach no other host). CrewAI's tool calls make no span. Run in a
  throwaway environment::

      python3 -m venv /tmp/venv-crewai-oll
      /tmp/venv-crewai-oll/bin/pip install 'crewai==1.15.30' 'opentelemetry-instrumentation-crewai==0.62.4'

- ``strands`` (Strands' own spans) and ``strands_openinference`` (with OpenInference's span
  processor over them): strands-agents 1.62.0, openinference-instrumentation-strands-agents 0.1.12;
- ``smolagents_openinference``: smolagents 1.26.0, openinference-instrumentation-smolagents 0.1.43;
- ``llama_index_openinference``: llama-index-core 0.14.25, openinference-instrumentation-llama-index
  4.6.1;
- ``agno_openinference``: agno 3.1.10, openinference-instrumentation-agno 1.0.15, on the scripted
  Agno model below (the project has no Agno runtime; Agno's telemetry off);
- ``openai_agents_openllmetry``: openai-agents 0.24.0, opentelemetry-instrumentation-openai-agents
  0.62.4 (OpenLLMetry), on the ``LoopModel`` of ``tests/instrumentation/openai_agents``.

Each in an environment of its own (the instrumentations pin different SDKs)::

    python3 -m venv /tmp/venv-X && /tmp/venv-X/bin/pip install opentelemetry-sdk PACKAGES

The Strands, smolagents and LlamaIndex programs are the ``build_loop`` of
``tests/instrumentation/<runtime>/<runtime>_loop.py``.

SCENARIO ``loop``: planner -> budget -> planner -> ... (``LOOP_TOOL_CALLS`` tool calls in all, the
scripted models' own limit); ``control``: planner asks budget once and budget answers;
``parallel`` (``openai_agents_openllmetry`` only): planner asks budget twice in one turn, the two
tool calls at once, and each budget answers. The spans
are kept by an in-memory exporter and written as JSON lines (the format of ``corpus/README.md``),
in the order they ended, into ``corpus/runtimes/`` (its README names each file's RUNTIME), apart
from ``corpus/``, whose every recording ``test_corpus.py`` expects the old detector to count right,
which it does not do of these (the reference of ``tests/processor/reference`` does). Re-record from
this folder, e.g.::

    for s in loop control; do
      ../../../.venv-runtimes/google-adk/bin/python record_runtime_telemetry.py \
        google_adk $s corpus/runtimes/adk.$s.spans.jsonl
      /tmp/venv-crewai-oll/bin/python record_runtime_telemetry.py \
        crewai_openllmetry $s corpus/runtimes/crewai_tl.$s.spans.jsonl
      /tmp/venv-strands/bin/python record_runtime_telemetry.py \
        strands_openinference $s corpus/runtimes/strands_oi.$s.spans.jsonl
    done

It prints one line ``RESULT {json}`` with how many tool calls the models made.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from record_app import JsonLinesExporter

RUNTIMES = Path(__file__).resolve().parents[2] / "instrumentation"  # the runtimes' offline models
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


class CallBudget:
    """How many tool calls all the scripted models of one run may still make."""

    def __init__(self, calls: int) -> None:
        self.left, self.made = calls, 0

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left, self.made = self.left - 1, self.made + 1
        return True


def tool_calls(scenario: str) -> int:
    """How many tool calls the scripted models of a scenario may make in all."""
    return LOOP_TOOL_CALLS if scenario == "loop" else 1


def run_strands(scenario: str) -> int:
    sys.path.insert(0, str(RUNTIMES / "strands"))
    from strands_loop import build_loop

    loop = build_loop(max_tool_calls=tool_calls(scenario))
    asyncio.run(loop.planner().invoke_async("Plan the team offsite"))
    return loop.calls.made


def openinference_strands(provider: TracerProvider) -> None:
    from openinference.instrumentation.strands_agents import StrandsAgentsToOpenInferenceProcessor

    # Before the exporter's processor: it rewrites each span's attributes as the span ends.
    provider.add_span_processor(StrandsAgentsToOpenInferenceProcessor())


def run_smolagents(scenario: str) -> int:
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor

    SmolagentsInstrumentor().instrument()
    return smolagents_program(scenario)


def smolagents_program(scenario: str) -> int:
    """The smolagents loop, traced by whatever instrumented it before."""
    sys.path.insert(0, str(RUNTIMES / "smolagents"))
    from smolagents_loop import build_loop

    loop = build_loop(max_tool_calls=tool_calls(scenario))
    loop.planner().run("Plan the team offsite")
    return loop.calls.made


def run_llama_index(scenario: str) -> int:
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    LlamaIndexInstrumentor().instrument()
    return llama_index_program(scenario)


def llama_index_program(scenario: str) -> int:
    """The LlamaIndex loop, traced by whatever instrumented it before."""
    sys.path.insert(0, str(RUNTIMES / "llama_index"))
    from llama_index_loop import build_loop

    loop = build_loop(max_tool_calls=tool_calls(scenario))

    async def run() -> None:  # a workflow's run starts inside the event loop
        await loop.planner().run(user_msg="Plan the team offsite")

    asyncio.run(run())
    return loop.calls.made


def run_agno(scenario: str) -> int:
    from openinference.instrumentation.agno import AgnoInstrumentor

    AgnoInstrumentor().instrument()
    return agno_program(scenario)


def agno_program(scenario: str) -> int:
    """The Agno loop on the scripted model below, traced by whatever instrumented it before."""
    os.environ["AGNO_TELEMETRY"] = "false"  # no analytics calls to Agno's servers
    from agno.agent import Agent
    from agno.models.base import Model
    from agno.models.message import Message
    from agno.models.response import ModelResponse

    calls = CallBudget(tool_calls(scenario))

    @dataclass
    class ScriptedModel(Model):
        """An offline Agno model: on a fresh turn it calls ``tool`` while the shared budget lasts;
        on a tool's result, or with no budget left, it answers in text."""

        tool: str = ""

        def invoke(self, messages: list[Message], assistant_message: Message, **kwargs: Any) -> ModelResponse:
            if messages[-1].role != "tool" and calls.take():
                call = {"name": self.tool, "arguments": json.dumps({"question": f"from {self.name}"})}
                return ModelResponse(
                    role="assistant",
                    tool_calls=[{"id": f"call_{calls.made}", "type": "function", "function": call}],
                )
            return ModelResponse(role="assistant", content=f"{self.name} answers")

        async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self.invoke(*args, **kwargs)

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            yield self.invoke(*args, **kwargs)

        async def ainvoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            yield self.invoke(*args, **kwargs)

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> ModelResponse:
            return response  # type: ignore[no-any-return]

        def _parse_provider_response_delta(self, response: Any) -> ModelResponse:
            return response  # type: ignore[no-any-return]

    def make(name: str) -> Any:
        other = "budget" if name == "planner" else "planner"
        model = ScriptedModel(id="scripted", name=name, provider="offline", tool=f"ask_{other}")

        def ask(question: str) -> str:
            return str(make(other).run(question).content)

        ask.__name__ = f"ask_{other}"
        return Agent(name=name, model=model, tools=[ask], telemetry=False)

    make("planner").run("Plan the team offsite")
    return calls.made


def run_openai_agents_openllmetry(scenario: str) -> int:
    sys.path.insert(0, str(RUNTIMES / "openai_agents"))
    os.environ["TRACELOOP_METRICS_ENABLED"] = "false"
    from agents import Agent, Runner, set_trace_processors
    from openai_agents_models import CallBudget as Calls
    from openai_agents_models import LoopModel

    # Nothing may reach the SDK's default exporter (api.openai.com): the instrumentation's
    # processor is the only one.
    set_trace_processors([])
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    OpenAIAgentsInstrumentor().instrument()
    calls = Calls(tool_calls(scenario))
    planner = Agent(name="planner", instructions="Plan the trip.")
    budget = Agent(name="budget", instructions="Price the plan.")
    planner.model = LoopModel("planner", "ask_budget", calls)
    budget.model = LoopModel("budget", "ask_planner", calls)
    if scenario == "parallel":
        # Two calls of ask_budget in one turn, which the SDK runs at once: their spans overlap.
        planner.model = parallel_model("planner", "ask_budget", 2)
        budget.model = LoopModel("budget", None, calls)
    planner.tools = [budget.as_tool("ask_budget", "Ask the budget agent.")]
    budget.tools = [planner.as_tool("ask_planner", "Ask the planner agent.")]
    Runner.run_sync(planner, "Plan a trip to Lisbon.")
    if scenario == "parallel":
        return 2
    return int(calls.made)


def parallel_model(me: str, tool: str, calls: int) -> Any:
    """An OpenAI Agents model that calls ``tool`` ``calls`` times in its first turn (the SDK runs
    them at once) and answers from their outputs."""
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    def respond(call: Any) -> Any:
        items = call.input if isinstance(call.input, list) else [{"role": "user", "content": call.input}]
        if items[-1].get("type") == "function_call_output":
            return [assistant_message(f"{me} answers")]
        return [
            function_call(tool, {"input": f"question {at} from {me}"}, call_id=f"call_parallel_{at}")
            for at in range(calls)
        ]

    return ScriptedModel([ModelStep.respond(respond), ModelStep.respond(respond)])


# Runtime -> (what it needs before the exporter's span processor, the program).
Runners = dict[str, tuple[Callable[[TracerProvider], None] | None, Callable[[str], int]]]
RUNNERS: Runners = {
    "google_adk": (None, run_google_adk),
    "crewai_openllmetry": (None, run_crewai_openllmetry),
    "strands": (None, run_strands),
    "strands_openinference": (openinference_strands, run_strands),
    "smolagents_openinference": (None, run_smolagents),
    "llama_index_openinference": (None, run_llama_index),
    "agno_openinference": (None, run_agno),
    "openai_agents_openllmetry": (None, run_openai_agents_openllmetry),
}


def main(
    argv: list[str], runners: Runners = RUNNERS, scenarios: tuple[str, ...] = ("loop", "control", "parallel")
) -> None:
    runtime, scenario, jsonl = argv
    if scenario not in scenarios:
        raise SystemExit(f"unknown scenario {scenario!r}; one of {', '.join(scenarios)}")
    if runtime not in runners:
        raise SystemExit(f"unknown runtime {runtime!r}; one of {', '.join(runners)}")
    before, run = runners[runtime]
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    if before is not None:
        before(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    calls = run(scenario)
    provider.force_flush()
    writer = JsonLinesExporter(jsonl)
    writer.export(memory.get_finished_spans())
    writer.shutdown()
    print("RESULT " + json.dumps({"tool_calls": calls}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
