"""Recorded third-party traces (``corpus/``) through the detector, in the orders spans really arrive.

The live tests (``test_third_party_traces.py``) export through the real SDK; these replay what the
instrumentations wrote, fast and in every order a pipeline may deliver: the whole trace in one
request, one span per request children first (exporters send spans as they end), and shuffled across
requests. Each loop is one ``planner>budget>planner`` series and each healthy run counts no cycle,
however the spans arrive.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from corpus_spans import CORPUS, read_spans, to_request
from otel_guard_processor.detector import Detector
from otel_guard_processor.otlp import parse_request

LOOPS = sorted(CORPUS.glob("*.loop.spans.jsonl"))
CONTROLS = sorted(CORPUS.glob("*.control.spans.jsonl"))
LOOP_CYCLES = {("cross_function", "planner>budget>planner"): 1}
LOOP_EDGES = {("planner", "budget"): 3, ("budget", "planner"): 2}


def detect(batches: list[list[dict[str, Any]]]) -> Detector:
    detector = Detector()
    for batch in batches:
        raw = to_request(batch).SerializeToString()
        detector.ingest(parse_request(raw), raw, 0.0)
    detector.expire(detector.limits.tool_edge_wait)  # the tool edges' wait is over
    return detector


def whole(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [records]


def children_first(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    ordered = sorted(records, key=lambda r: r["start"], reverse=True)
    return [[record] for record in ordered]


def parents_first(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    ordered = sorted(records, key=lambda r: r["start"])
    return [[record] for record in ordered]


def shuffled(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    mixed = list(records)
    random.Random(len(records)).shuffle(mixed)
    third = max(1, len(mixed) // 3)
    return [mixed[:third], mixed[third : 2 * third], mixed[2 * third :]]


ORDERS = [whole, children_first, parents_first, shuffled]


def test_the_corpus_holds_every_dialect() -> None:
    prefixes = {path.name.split(".")[0] for path in LOOPS}
    assert prefixes == {p.name.split(".")[0] for p in CONTROLS}
    assert {"pai_builtin", "pai_oi_same", "oai_oi", "oai_otelv2", "lg_oi", "lg_tl"} <= prefixes
    scopes = {record["scope"] for path in LOOPS for record in read_spans(path)}
    assert {
        "pydantic-ai",
        "openinference.instrumentation.openai_agents",
        "opentelemetry.instrumentation.openai_agents",
        "openinference.instrumentation.langchain",
        "opentelemetry.instrumentation.langchain",
    } <= scopes


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("path", LOOPS, ids=lambda path: path.name.split(".")[0])
def test_a_recorded_loop_is_one_series_in_any_order(path: Path, order: Any) -> None:
    detector = detect(order(read_spans(path)))
    assert detector.cycles == LOOP_CYCLES


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("path", LOOPS, ids=lambda path: path.name.split(".")[0])
def test_a_recorded_loop_has_one_edge_per_call_between_agents(path: Path, order: Any) -> None:
    assert detect(order(read_spans(path))).delegations == LOOP_EDGES


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("path", CONTROLS, ids=lambda path: path.name.split(".")[0])
def test_a_recorded_healthy_run_counts_no_cycle_in_any_order(path: Path, order: Any) -> None:
    detector = detect(order(read_spans(path)))
    assert detector.cycles == {}
    assert detector.delegations.get(("planner", "budget")) == 1


def test_a_span_received_twice_counts_nothing_more() -> None:
    records = read_spans(CORPUS / "lg_tl.loop.spans.jsonl")
    detector = detect([records, records])
    assert detector.cycles == LOOP_CYCLES
    assert detector.delegations == LOOP_EDGES
    assert detector.duplicates == len(records)
