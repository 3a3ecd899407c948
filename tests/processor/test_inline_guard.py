"""The inline guard's spans, exported over OTLP from a real instrumented process, show the processor
the same loops the guard refused -- without the processor reading any token."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from processor_helpers import ProcessorFactory, grpc_address, scrape, series

APP = Path(__file__).with_name("guarded_agents_app.py")


@pytest.mark.integration
@pytest.mark.slow
async def test_processor_finds_the_loops_the_guard_refused(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(APP), grpc_address(processor)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    refusals = [json.loads(line) for line in result.stdout.splitlines()]
    # What the guard refused, as the program saw it.
    assert {(r["reason"], r["agent"], tuple(r["chain"])) for r in refusals} == {
        ("cycle", "planner", ("planner", "budget")),
        ("cycle", "summarize", ("summarize",)),
        ("cycle", "planner", ("planner", "budget")),
    }
    for _ in range(100):  # the exporter's last batch may still be in flight
        if processor.detector.cycles and processor.stats.inflight == 0:
            break
        await asyncio.sleep(0.1)
    await processor.detection.settled()  # detection runs after the answer
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
