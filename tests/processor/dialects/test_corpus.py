"""Recorded third-party traces (``corpus/``) through the detector, in the orders spans really arrive.

The live tests (``test_third_party_traces.py``) export through the real SDK; these replay what the
instrumentations wrote, fast and in every order a pipeline may deliver: the whole trace in one
request, one span per request children first (exporters send spans as they end), and shuffled across
requests. Each loop is one ``planner>budget>planner`` series and each healthy run counts no cycle,
however the spans arrive. The runtimes traced by their own telemetry (``corpus/runtimes``: Google
ADK's, CrewAI's under OpenLLMetry, which the retired pure-Python detector counted wrong) count the
same, here and through a running processor's ``/metrics``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from corpus_spans import CORPUS, read_spans, to_request
from otel_guard_processor.dialects_file import Spec, read_dialects
from otel_guard_processor.engine import EngineDetector, dialect_table
from processor_helpers import ProcessorFactory, export, scrape, series

RUNTIMES = CORPUS / "runtimes"
# The runtimes whose telemetry names both agents and nests each under the tool that ran it (or, as
# OpenLLMetry's flat OpenAI Agents spans, in time alone, read back): their counts are the corpus's
# own. (The others count as the README's table says: smolagents' final_answer tool, the tool-level
# loops where no agent is named, the official OpenAI Agents instrumentation's workflow span; the
# service test below holds each to tests/processor/reference/test_reference.py's RIGHT.)
NAMED_AND_NESTED = (
    "adk",
    "crewai_tl",
    "strands",
    "strands_oi",
    "agno_oi",
    "agno_genai",
    "smolagents_genai",
    "llama_index_genai",
    "lg_genai_agent",
    "oai_tl",
)
# The observability SDKs' decorators (corpus/vendors) that name both agents by their own span kinds,
# and their integrations with agent runtimes that name both; Laminar's decorators and instrumentor,
# Phoenix's decorators and MLflow's LangChain and pydantic-ai autologs name no agent (RIGHT),
# Logfire's decorators and its OpenAI Agents integration are taught by a dialects file.
VENDORS = CORPUS / "vendors"
VENDORS_NAMED = (
    "langfuse",
    "mlflow",
    "mlflow_oai",
    "agentops",
    "langfuse_oai",
    "phoenix_oai",
    "agentops_oai",
    "logfire_pai",
    "langfuse_lg",
    "lmnr_lg",
    "langfuse_lg_same",
    "lmnr_lg_same",
)
LOGFIRE_FILE = Path(__file__).parents[3] / "docs" / "examples" / "dialects-logfire.yaml"
TAUGHT_BY_FILE = {"logfire": LOGFIRE_FILE, "logfire_oai": LOGFIRE_FILE}
LOOPS = (
    sorted(CORPUS.glob("*.loop.spans.jsonl"))
    + [RUNTIMES / f"{name}.loop.spans.jsonl" for name in NAMED_AND_NESTED]
    + [VENDORS / f"{name}.loop.spans.jsonl" for name in VENDORS_NAMED]
)
CONTROLS = (
    sorted(CORPUS.glob("*.control.spans.jsonl"))
    + [RUNTIMES / f"{name}.control.spans.jsonl" for name in NAMED_AND_NESTED]
    + [VENDORS / f"{name}.control.spans.jsonl" for name in VENDORS_NAMED]
)
LOOP_CYCLES = {("cross_function", "planner>budget>planner"): 1}
LOOP_EDGES = {("planner", "budget"): 3, ("budget", "planner"): 2}


def detect(batches: list[list[dict[str, Any]]], dialects: tuple[Spec, ...] = ()) -> EngineDetector:
    detector = EngineDetector(dialects=dialects)
    for batch in batches:
        detector.ingest(to_request(batch).SerializeToString(), 0.0)
    detector.expire(detector.limits.count_wait)  # the counts' wait is over
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
    assert {
        "pai_builtin",
        "pai_oi_same",
        "oai_oi",
        "oai_otelv2",
        "lg_oi",
        "lg_tl",
        "adk",
        "crewai_tl",
    } <= prefixes
    scopes = {record["scope"] for path in LOOPS for record in read_spans(path)}
    assert {
        "pydantic-ai",
        "openinference.instrumentation.openai_agents",
        "opentelemetry.instrumentation.openai_agents",
        "openinference.instrumentation.langchain",
        "opentelemetry.instrumentation.langchain",
        "gcp.vertex.agent",
        "opentelemetry.instrumentation.crewai.instrumentation",
        "opentelemetry.instrumentation.genai.agno",
        "opentelemetry.instrumentation.genai.smolagents",
        "opentelemetry.instrumentation.genai.llama_index",
        "opentelemetry.instrumentation.genai.langchain",
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


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("vendor", sorted(TAUGHT_BY_FILE))
def test_a_vendor_taught_by_its_shipped_dialects_file_is_one_series_and_the_references_count(
    vendor: str, order: Any
) -> None:
    """Logfire's message-template spans: nothing without the file (RIGHT), the corpus's counts with
    it, in the engine as in the reference reading the same file."""
    from reference.dialects import with_rows
    from reference.reference import detect as reference_detect

    rows = read_dialects(TAUGHT_BY_FILE[vendor], dialect_table()[0])
    for scenario, cycles, edges in (
        ("loop", LOOP_CYCLES, LOOP_EDGES),
        ("control", {}, {("planner", "budget"): 1}),
    ):
        batches = order(read_spans(VENDORS / f"{vendor}.{scenario}.spans.jsonl"))
        detector = detect(batches, rows)
        assert (detector.cycles, detector.delegations) == (cycles, edges)
        assert detect(batches).cycles == {}
        raws = [to_request(batch).SerializeToString() for batch in batches]
        metrics = reference_detect(raws, with_rows(rows))
        assert (metrics.cycles, metrics.delegations) == (cycles, edges)


def test_logfires_dialects_file_changes_nothing_of_its_pydantic_ai_integrations_spans() -> None:
    """``logfire.instrument_pydantic_ai()`` writes pydantic-ai's GenAI spans, read by the built-in
    rows: a team that also loads the Logfire file for its own spans counts the same."""
    rows = read_dialects(LOGFIRE_FILE, dialect_table()[0])
    for scenario in ("loop", "control"):
        batches = whole(read_spans(VENDORS / f"logfire_pai.{scenario}.spans.jsonl"))
        with_file, without = detect(batches, rows), detect(batches)
        assert (with_file.cycles, with_file.delegations) == (without.cycles, without.delegations)
        assert without.delegations[("planner", "budget")] >= 1


@pytest.mark.parametrize(
    "path",
    sorted(RUNTIMES.glob("*.spans.jsonl")) + sorted(VENDORS.glob("*.spans.jsonl")),
    ids=lambda path: f"{path.parent.name}/{path.name.split('.spans')[0]}",
)
async def test_a_runtimes_own_telemetry_counts_right_through_the_service(
    start_processor: ProcessorFactory, path: Path
) -> None:
    """Google ADK's healthy run is no ``planner>planner`` (its invoke_workflow around invoke_agent is
    one call), and CrewAI's loop under OpenLLMetry is counted: read from /metrics, each span
    exported as it ended (children first), one request each."""
    from reference.test_reference import RIGHT  # here: test_reference imports this module

    processor = await start_processor(count_wait=0.0)
    for batch in children_first(read_spans(path)):
        await export(processor, to_request(batch).SerializeToString())
    samples = await scrape(processor)
    cycles = series(samples, "otel_guard_cycles_total")  # (label, kind)
    edges = series(samples, "otel_guard_delegations_total")  # (callee, caller)
    right_cycles, right_edges = RIGHT[f"{path.parent.name}/{path.name.removesuffix('.spans.jsonl')}"]
    assert cycles == {(label, kind): n for (kind, label), n in right_cycles.items()}
    assert edges == {(callee, caller): n for (caller, callee), n in right_edges.items()}
