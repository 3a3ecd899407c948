"""Recorded traces of otel-guard beside a third-party instrumentation (``corpus/beside/``), replayed.

Each pairing of ``test_beside_the_guard.py`` recorded once (``record_app.py ... --guard --jsonl``):
the guard's spans and the third party's spans of the same calls, in one trace. Whatever the order
they arrive in, the detector counts what it counts of the guard's spans alone: one series
``planner>budget>planner``, one edge per call, and nothing in a healthy run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from corpus_spans import CORPUS, read_spans
from test_corpus import LOOP_CYCLES, LOOP_EDGES, ORDERS, detect

BESIDE = CORPUS / "beside"
PAIRINGS = (
    "lg_oi",
    "lg_oi_under",
    "lg_tl",
    "lg_tl_under",
    "oai_oi",
    "oai_otelv2",
    "pai_builtin",
    "pai_oi",
)
# (scenario, mode) -> (cycles, edges (caller, callee), the refusals of planner)
EXPECTED: dict[tuple[str, str], tuple[dict[Any, int], dict[Any, int], int]] = {
    # planner -> budget -> planner, refused: the attempt is an edge too.
    ("loop", "enforce"): (LOOP_CYCLES, {("planner", "budget"): 1, ("budget", "planner"): 1}, 1),
    ("loop", "observe"): (LOOP_CYCLES, LOOP_EDGES, 0),
    ("control", "enforce"): ({}, {("planner", "budget"): 1}, 0),
}


def recording(pairing: str, scenario: str, mode: str) -> Path:
    return BESIDE / f"{pairing}.{scenario}.{mode}.spans.jsonl"


def test_every_pairing_was_recorded_with_both_instrumentations() -> None:
    for pairing in PAIRINGS:
        for scenario, mode in EXPECTED:
            scopes = {record["scope"] for record in read_spans(recording(pairing, scenario, mode))}
            assert "otel_guard" in scopes, pairing
            assert len(scopes) >= 2, (pairing, scopes)


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize(("scenario", "mode"), sorted(EXPECTED), ids=str)
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_beside_the_guard_a_trace_counts_what_the_guard_alone_counts(
    pairing: str, scenario: str, mode: str, order: Any
) -> None:
    cycles, edges, refusals = EXPECTED[(scenario, mode)]
    detector = detect(order(read_spans(recording(pairing, scenario, mode))))
    assert detector.cycles == cycles
    assert detector.delegations == edges
    assert detector.decisions.get(("refuse", "cycle", "planner"), 0) == refusals
