"""The processor on the telemetry teams already have: real third-party instrumentations, live.

Each case runs two agents (planner and budget, delegating through tools) in a real runtime traced by a
real instrumentation with nothing of otel-guard's in the process, exporting over OTLP/gRPC to a
processor on 127.0.0.1; the counts are read from its /metrics. A loop is one
``otel_guard_cycles_total`` series labelled in agent names; a healthy run counts no cycle, also when
the tools are named like the agents they run (an agent called as a tool named after it).
"""

from __future__ import annotations

import pytest
from dialect_runs import record
from processor_helpers import ProcessorFactory, grpc_address, scrape, series

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INSTRUMENTED_RUNTIMES = [
    ("pydantic_ai", "builtin"),  # pydantic-ai's own Agent.instrument_all()
    ("pydantic_ai", "openinference"),  # openinference-instrumentation-pydantic-ai
    ("openai_agents", "openinference"),  # openinference-instrumentation-openai-agents
    ("openai_agents", "otel_v2"),  # opentelemetry-instrumentation-openai-agents-v2
    ("langgraph", "openinference"),  # openinference-instrumentation-langchain
    ("langgraph", "traceloop"),  # opentelemetry-instrumentation-langchain (OpenLLMetry)
]
NAMINGS = {"ask": [], "same": ["--same-names"]}
LOOP_TOOL_CALLS = 5  # record_app.LOOP_TOOL_CALLS: planner -> budget three times, budget -> planner twice


@pytest.mark.parametrize("naming", sorted(NAMINGS))
@pytest.mark.parametrize(("runtime", "instrumentation"), INSTRUMENTED_RUNTIMES)
async def test_a_loop_counts_once_in_agent_names(
    start_processor: ProcessorFactory, runtime: str, instrumentation: str, naming: str
) -> None:
    processor = await start_processor()
    result = await record(grpc_address(processor), runtime, instrumentation, "loop", *NAMINGS[naming])
    assert result["tool_calls"] == LOOP_TOOL_CALLS
    samples = await scrape(processor)
    assert series(samples, "otel_guard_cycles_total") == {("planner>budget>planner", "cross_function"): 1}
    # (callee, caller): one edge per call, between agents, never to a tool.
    assert series(samples, "otel_guard_delegations_total") == {
        ("budget", "planner"): 3,
        ("planner", "budget"): 2,
    }


@pytest.mark.parametrize("naming", sorted(NAMINGS))
@pytest.mark.parametrize(("runtime", "instrumentation"), INSTRUMENTED_RUNTIMES)
async def test_a_healthy_run_counts_no_cycle(
    start_processor: ProcessorFactory, runtime: str, instrumentation: str, naming: str
) -> None:
    processor = await start_processor()
    result = await record(grpc_address(processor), runtime, instrumentation, "control", *NAMINGS[naming])
    assert result["tool_calls"] == 1
    samples = await scrape(processor)
    assert series(samples, "otel_guard_cycles_total") == {}
    assert series(samples, "otel_guard_delegations_total") == {("budget", "planner"): 1}
    received = series(samples, "otel_guard_processor_spans_total")[("received",)]
    assert received >= 6  # the runs were traced and reached the processor
