"""Transfers and labels through the real processor: the inline guard's own spans of a hand-back by
handoffs, exported over OTLP/gRPC from a real instrumented process, count no cycle, while the same
shape by calls counts one; and names holding ``>`` or ``\\`` read back from their labels and edges.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from otel_guard_processor.metrics import cycle_edges
from processor_helpers import ProcessorFactory, run_guarded_app, scrape, series, settled

APP = Path(__file__).with_name("transfers_app.py")


@pytest.mark.integration
async def test_a_hand_back_by_handoffs_is_no_cycle_and_by_calls_is_one(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor()
    printed = await run_guarded_app(APP, processor, timeout=25)
    # What the guard refused: the call back, and the two loops; never the hand-back.
    assert printed == [
        {"reason": "cycle", "agent": "triage", "chain": "triage → faq"},
        {"reason": "cycle", "agent": "planner>budget", "chain": "planner>budget"},
        {"reason": "cycle", "agent": "fx\\eu", "chain": "fx\\eu → rates"},
    ]
    expected = {
        ("cross_function", "triage>faq>triage"): 1,
        ("direct", r"planner\>budget>planner\>budget"): 1,
        ("cross_function", r"fx\\eu>rates>fx\\eu"): 1,
    }
    await settled(processor, cycles=len(expected))
    assert processor.detector.cycles == expected
    samples = await scrape(processor)
    assert series(samples, "otel_guard_cycles_total") == {(label, kind): 1 for kind, label in expected}
    # The hand-back's edges are delegations like any other; only the loops' edges are cycle edges.
    delegations = series(samples, "otel_guard_delegations_total")
    assert delegations[("faq", "triage")] == 2  # once handed back, once called back
    assert series(samples, "otel_guard_cycle_edges_total") == {
        ("faq", "triage"): 1,
        ("triage", "faq"): 1,
        ("planner>budget", "planner>budget"): 1,
        ("rates", "fx\\eu"): 1,
        ("fx\\eu", "rates"): 1,
    }


def test_cycle_edges_read_escaped_names_back() -> None:
    """An agent ``planner>budget`` calling itself is one edge to itself, not planner → budget."""
    assert cycle_edges({("direct", r"planner\>budget>planner\>budget"): 2}) == {
        ("planner>budget", "planner>budget"): 2
    }
    assert cycle_edges({("cross_function", r"a\\>b\\\>c>a\\"): 1}) == {
        ("a\\", "b\\>c"): 1,
        ("b\\>c", "a\\"): 1,
    }
    # Cut: the last, cut name is no name (a dangling escape before the cut included).
    assert cycle_edges({("cross_function", "x\\>y>z\\…"): 1}) == {}
    assert cycle_edges({("cross_function", "x>y\\>z>w\\…"): 1}) == {("x", "y>z"): 1}
