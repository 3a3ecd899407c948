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


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_the_recordings_hold_the_guards_spans_as_it_writes_them_today(pairing: str) -> None:
    """Lean hop spans (docs/spec.md §9): a hop span leaves the chain's lists out only when it is an
    allowed hop directly under its previous hop's span. None here is one (the guard's spans go
    under the runtime's or the tracer's; the one directly under a hop span is refused), so every
    hop span names its chain, as the guard writes these runs today: no re-recording needed."""
    for scenario, mode in EXPECTED:
        records = read_spans(recording(pairing, scenario, mode))
        by_id = {record["span_id"]: record for record in records}
        for record in records:
            attributes = record["attributes"]
            if record["scope"] != "otel_guard" or "otel_guard.decision" not in attributes:
                continue
            parent = by_id.get(record["parent_id"] or "")
            above = parent["attributes"] if parent is not None and parent["scope"] == "otel_guard" else {}
            nested = (
                attributes["otel_guard.decision"] == "allow"
                and above.get("otel_guard.chain.root") == attributes["otel_guard.chain.root"]
                and above.get("otel_guard.chain.depth") == attributes["otel_guard.chain.depth"] - 1
            )
            assert ("otel_guard.chain.agents" not in attributes) == nested, (pairing, record["name"])


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
