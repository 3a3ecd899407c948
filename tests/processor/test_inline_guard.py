"""The inline guard's spans, exported over OTLP from a real instrumented process, show the processor
the same loops the guard refused -- without the processor reading any token."""

from __future__ import annotations

from pathlib import Path

import pytest
from processor_helpers import ProcessorFactory, run_guarded_app, scrape, series, settled

APP = Path(__file__).with_name("guarded_agents_app.py")


@pytest.mark.integration
@pytest.mark.slow
async def test_processor_finds_the_loops_the_guard_refused(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    refusals = await run_guarded_app(APP, processor, timeout=60)
    # What the guard refused, as the program saw it.
    assert {(r["reason"], r["agent"], tuple(r["chain"])) for r in refusals} == {
        ("cycle", "planner", ("planner", "budget")),
        ("cycle", "summarize", ("summarize",)),
        ("cycle", "planner", ("planner", "budget")),
    }
    await settled(processor, cycles=3)
    assert processor.detector.cycles == {
        ("cross_function", "planner>budget>planner"): 1,
        ("direct", "summarize>summarize"): 1,
        ("cross_trace", "planner>budget>planner"): 1,
    }
    samples = await scrape(processor)
    assert series(samples, "otel_guard_cycles_total") == {
        ("planner>budget>planner", "cross_function"): 1,
        ("summarize>summarize", "direct"): 1,
        ("planner>budget>planner", "cross_trace"): 1,
    }
    decisions = series(samples, "otel_guard_span_decisions_total")
    assert decisions[("planner", "refuse", "cycle")] == 2
    assert decisions[("summarize", "refuse", "cycle")] == 1
    assert decisions[("search", "allow", "")] == 1
    # The remote call recorded on both sides counts once, and is no loop.
    delegations = series(samples, "otel_guard_delegations_total")
    assert delegations[("weather", "travel")] == 1
    assert delegations[("budget", "planner")] == 2
