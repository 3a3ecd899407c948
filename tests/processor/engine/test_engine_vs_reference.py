"""The compiled engine against the plain reference: the same counts from the same request bytes.

The engine is fed through its binding (``Engine.ingest``), every request at one instant, then swept
once everything may go (``expire`` past every TTL and wait: waiting spans settle, due counts are
made) and its trees let go; the reference (``tests/processor/reference``) reads the same bytes.
They must count alike -- cycles, the span each cycle's count names, delegation edges, decisions,
tree hops, spans received and received again -- on every recording of
``tests/processor/dialects/corpus`` (``runtimes/`` included: Google ADK's own spans, CrewAI under
OpenLLMetry) in several arrival orders, batch splits, a retry, key-first and value-first encodings;
on hypothesis span forests of every style; on chains of calls and handoffs (a return through a
transfer is no cycle); and on the forests the detector gets wrong (``KNOWN_FOREST_DIFFERENCES``),
where the reference is right.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from corpus_spans import read_spans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otel_guard_processor._engine import cycle_names, one_call_rules
from otel_guard_processor.engine import Engine, EngineDetector, dialect_table
from processor_spans import GUARD_SCOPE, Trace, encode
from reference import dialects, transfers
from reference.conventions import FORESTS as SHAPED
from reference.forests import (
    FIXED_STYLES,
    ROOTS,
    STYLES,
    Call,
    Delivery,
    calls,
    deliveries,
    requests,
    spans_of,
)
from reference.reference import Entry, detect, label_names, step
from reference.test_reference import (
    CONVENTION_COUNTS,
    ENCODINGS,
    KNOWN_FOREST_DIFFERENCES,
    RECORDINGS,
    RIGHT,
    SWEEP,
    Counts,
    bounded,
    counts,
    recording,
)
from test_corpus import ORDERS

Returns = dict[tuple[str, str], list[tuple[str, str]]]


@dataclass(frozen=True)
class Seen:
    """What one side counted: the counts as the processor serves them, and each cycle's spans."""

    counts: Counts
    returns: Returns  # (kind, label) -> the (trace id, span id) of each count, hex, sorted


def engine(raws: Sequence[bytes]) -> Seen:
    detector = EngineDetector()
    received = 0
    returns: Returns = {}
    for raw in raws:
        received += detector.ingest(raw, 0.0)
    for events in (detector.engine.expire(SWEEP), detector.engine.release_trees()):
        detector._tally(events)
        for kind, label, trace_id, span_id in events.cycles:
            returns.setdefault((kind, label), []).append((trace_id.hex(), span_id.hex()))
    assert (detector.stored_spans, detector.pending_spans, detector.active_traces) == (0, 0, 0)
    assert detector.engine.faults == 0
    seen = Counts(
        detector.cycles,
        detector.delegations,
        detector.decisions,
        (detector.tree_hops, detector.tree_hops_sum),
        received,
        detector.duplicates,
    )
    return Seen(seen, {key: sorted(spans) for key, spans in returns.items()})


def reference(raws: Sequence[bytes]) -> Seen:
    metrics = detect(raws)
    return Seen(counts(metrics), {key: sorted(spans) for key, spans in metrics.returns.items()})


# --- the recordings ------------------------------------------------------------------------------

Records = list[dict[str, Any]]


def ended(records: Records) -> list[Records]:
    """One request, children first (as exporters send): the engine reads such a batch backwards."""
    return [sorted(records, key=lambda record: record["start"], reverse=True)]


def scattered(records: Records) -> list[Records]:
    """Shuffled into requests of one to five spans."""
    mixed = list(records)
    rng = random.Random(len(records) + 1)
    rng.shuffle(mixed)
    batches = []
    while mixed:
        size = rng.randint(1, 5)
        batches.append(mixed[:size])
        mixed = mixed[size:]
    return batches


def retried(records: Records) -> list[Records]:
    """Three requests, the second sent again at the end (a client's retry)."""
    third = max(1, len(records) // 3)
    batches = [records[:third], records[third : 2 * third], records[2 * third :]]
    return [*batches, batches[1]]


ENGINE_ORDERS: list[Callable[[Records], list[Records]]] = [*ORDERS, ended, scattered, retried]


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("order", ENGINE_ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("path", RECORDINGS, ids=recording)
def test_every_recording_counts_as_the_reference_in_any_order_and_encoding(
    path: Path, order: Callable[[Records], list[Records]], encoding: str
) -> None:
    raws = [ENCODINGS[encoding](batch) for batch in order(read_spans(path))]
    assert engine(raws) == reference(raws)


def test_the_runtimes_recordings_count_right() -> None:
    """ADK's invoke_workflow around invoke_agent is one call; CrewAI's X.agent spans are named by
    gen_ai.agent.name (both counted wrong by the retired pure-Python detector); and the other
    runtimes' recordings (Strands, OpenInference for smolagents, LlamaIndex, Agno and Strands,
    OpenLLMetry for the OpenAI Agents SDK) and the observability SDKs' (``vendors/``) count as the
    corpus's README says."""
    runtimes = {recording(path): path for path in RECORDINGS if path.parent.name in ("runtimes", "vendors")}
    right = RIGHT
    assert set(runtimes) == set(right)
    for name, path in runtimes.items():
        for order in ENGINE_ORDERS:
            raws = [ENCODINGS["value_first"](batch) for batch in order(read_spans(path))]
            seen = engine(raws).counts
            assert (seen.cycles, seen.delegations) == right[name], (name, order.__name__)


def test_names_labels_and_paths_are_bounded_as_the_reference_bounds_them() -> None:
    raws = [encode(*bounded())]
    assert engine(raws) == reference(raws)
    detector = EngineDetector()
    detector.ingest(raws[0], 0.0)
    detector.expire(SWEEP)
    assert detector.truncated["label"] == 1
    assert detector.truncated["name"] > 0


# --- forests -------------------------------------------------------------------------------------

FORESTS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FORESTS
@given(calls(STYLES), st.sampled_from(STYLES), deliveries, st.sampled_from(ROOTS))
def test_any_forest_in_any_delivery_counts_as_the_reference(
    call: Call, style: str, delivery: Delivery, root: str
) -> None:
    raws = requests(spans_of(call, style, root), delivery)
    assert engine(raws) == reference(raws)


GUARD_STYLES = tuple(style for style in STYLES if style.startswith("guard"))


@FORESTS
@given(calls(STYLES), st.sampled_from(GUARD_STYLES), deliveries, st.sampled_from(ROOTS))
def test_lean_guard_spans_count_as_the_guards_spans_with_their_lists(
    call: Call, style: str, delivery: Delivery, root: str
) -> None:
    """Nested hops without ``otel_guard.chain.agents`` (docs/spec.md §9) take their path from their
    ancestors: every loop, cross-trace and cross-process ones among them, counts as it does when
    every hop span names its chain, in any delivery that loses no span."""
    delivery = replace(delivery, lost=[])
    lean = requests(spans_of(call, style, root), delivery)
    full = requests(spans_of(call, style, root, lean=False), delivery)
    assert engine(lean) == engine(full)


@FORESTS
@given(calls(FIXED_STYLES, hops=("in_process",)), st.sampled_from(FIXED_STYLES), deliveries)
def test_any_forest_of_the_fixed_runtimes_counts_as_the_reference(
    call: Call, style: str, delivery: Delivery
) -> None:
    """Google ADK's spans and CrewAI's under OpenLLMetry, agents in one process (CrewAI's tool
    calls make no span, so a call through a tool starts nowhere else)."""
    raws = requests(spans_of(call, style), delivery)
    assert engine(raws) == reference(raws)


@pytest.mark.parametrize("name", sorted(KNOWN_FOREST_DIFFERENCES))
def test_the_forests_the_detector_counts_otherwise_count_as_the_reference(name: str) -> None:
    known = KNOWN_FOREST_DIFFERENCES[name]
    for delivery, _ in known.today:
        for again in (delivery, replace(delivery, order="ended"), replace(delivery, order="shuffled")):
            raws = requests(known.spans(), again, known.keep_linked)
            ours = engine(raws)
            assert ours == reference(raws), known.why
            assert ours.counts.delegations == known.right
            if known.right_cycles is not None:
                assert ours.counts.cycles == known.right_cycles


# --- the table -----------------------------------------------------------------------------------


def test_the_engines_dialect_table_is_the_references_row_for_row() -> None:
    rows, wrappers = dialect_table()
    table = [
        *dialects.NAME_ROWS,
        *dialects.KIND_ROWS,
        *dialects.OPERATION_ROWS,
        *dialects.PROTOCOL_ROWS,
        *dialects.SDK_ROWS,
    ]
    assert rows == [
        (row.dialect, row.key, row.value, row.kind, row.names, row.conditional, row.scope) for row in table
    ]
    assert [(table[wrapper], table[wrapped]) for wrapper, wrapped in wrappers] == list(dialects.WRAPPERS)


HopFacts = tuple[str, int | None, int, bool, bool, bool, bool, int]  # as one_call_rules() gives them
DIALECT_PAGE = Path(__file__).resolve().parents[3] / "docs" / "processor" / "dialects.md"
SOURCES = {
    "the span name": dialects.SPAN_NAME,
    "the span name's subject": dialects.SUBJECT,
    "the span name before its last dot": dialects.STEM,
}


def page_tables() -> list[list[list[str]]]:
    """The page's markdown tables, in order, each its rows of cells (the header and rule dropped)."""
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*DIALECT_PAGE.read_text(encoding="utf-8").splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows[2:])
            rows = []
    return tables


def code(cell: str) -> str:
    assert cell.startswith("`"), cell
    assert cell.endswith("`"), cell
    return cell[1:-1]


def page_row(cells: list[str]) -> tuple[object, ...]:
    """A row of the page's dialect table as dialect_table() gives it."""
    dialect, key, value, kind, names, conditional, scope = cells
    return (
        dialect,
        SOURCES.get(key) or code(key),
        code(value),
        None if kind.startswith("—") else kind,
        tuple(SOURCES.get(name) or code(name) for name in names.split(", ")) if names else (),
        {"yes": True, "": False}[conditional],
        code(scope) if scope else None,
    )


def test_the_dialect_page_is_the_engines_table_wrappers_and_one_call_rules_row_for_row() -> None:
    table, wrappers, rules, *_ = page_tables()
    rows, pairs = dialect_table()
    assert [int(cells[0]) for cells in table] == list(range(1, len(rows) + 1))
    assert [page_row(cells[1:]) for cells in table] == rows
    assert [(int(a.removeprefix("#")) - 1, int(b.removeprefix("#")) - 1) for a, b, _ in wrappers] == pairs
    assert [tuple(cells) for cells in rules] == [rule[:3] for rule in one_call_rules()]


def test_the_reference_makes_of_each_one_call_case_what_the_engine_makes() -> None:
    table = [
        *dialects.NAME_ROWS,
        *dialects.KIND_ROWS,
        *dialects.OPERATION_ROWS,
        *dialects.PROTOCOL_ROWS,
        *dialects.SDK_ROWS,
    ]

    def entry(facts: HopFacts, name: str) -> Entry:
        kind, row, scope, client, server, guard, caller, name_depth = facts
        read = table[row] if row is not None else None
        # (a hop of the guard's chain and a named caller have no row and no scope)
        return Entry(
            name, kind, None, read, str(scope) if read else None, client, server, guard, name_depth, caller
        )

    for above, below, outcome, last, this, same_name, repeats in one_call_rules():
        above_entry = entry(last, "planner") if last is not None else None
        assert step(above_entry, entry(this, "planner" if same_name else "budget"), repeats) == outcome, (
            above,
            below,
        )


# --- waits ---------------------------------------------------------------------------------------


def test_a_loops_count_waits_for_an_earlier_return_and_then_names_the_first() -> None:
    """fx runs planner > budget > planner and budget > planner > budget: one loop in the trace.
    Delivered the later turn first, the engine waits cycle_wait before it counts, so the turn that
    started first names it; counted at once, the later turn would have."""
    spans = KNOWN_FOREST_DIFFERENCES["which turn names a loop"].spans()
    later_first = requests(spans, Delivery("ended", 8, [False] * 8, None, [], 0))
    engine_ = Engine(cycle_wait=5.0)
    seen = [engine_.ingest(raw, 100.0).cycles for raw in later_first]
    assert seen == [[]] * len(later_first)
    assert engine_.expire(104.0).cycles == []
    ((kind, label, _, _),) = engine_.expire(105.0).cycles
    assert (kind, label) == ("cross_function", "planner>budget>planner")
    assert engine_.expire(SWEEP).cycles == []  # counted once


def test_an_agent_calls_edge_counts_at_once_and_a_tools_after_its_wait() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    trace.agent("budget", planner)
    trace.tool("search", planner)
    engine_ = Engine(tool_edge_wait=10.0)
    assert engine_.ingest(encode(*trace.spans), 50.0).delegations == {("planner", "budget"): 1}
    assert engine_.expire(59.0).delegations == {}
    assert engine_.expire(60.0).delegations == {("planner", "search"): 1}


def test_a_run_recorded_by_both_sources_counts_for_each_whichever_arrives_first() -> None:
    """pydantic-ai records planner calling budget directly and through a tool whose run it records
    (started later); the guard records only the run (started first). Each source counts the calls
    it recorded -- pydantic-ai two, the guard one -- and the larger is the edge's: two, in either
    order. Before, the run was its first-started span's source: the engine counted it at once as
    pydantic-ai's and could not take the count back when the guard's span came."""
    trace = Trace()
    planner = trace.agent("planner", scope="pydantic-ai")
    trace.agent("budget", planner, scope="pydantic-ai")
    tool = trace.tool("ask_budget", planner, scope="pydantic-ai")
    guards_run = trace.agent("budget", tool, scope=GUARD_SCOPE)
    trace.agent("budget", tool, scope="pydantic-ai")
    guard = encode(guards_run)
    others = encode(*(span for span in trace.spans if span is not guards_run))
    for raws in ([others, guard], [guard, others]):
        assert engine(raws).counts.delegations == {("planner", "budget"): 2}
        assert reference(raws).counts.delegations == {("planner", "budget"): 2}


# --- the newest conventions' shapes --------------------------------------------------------------


@FORESTS
@given(st.sampled_from(sorted(SHAPED)), st.booleans(), deliveries)
def test_the_conventions_shapes_count_as_the_reference_in_any_delivery(
    name: str, loop: bool, delivery: Delivery
) -> None:
    """Workflows as invoke_agent spans, transfers, A2A and MCP spans, a CLIENT span naming its
    caller (tests/processor/reference/conventions.py): the engine counts what the reference counts,
    and, delivered whole, what test_reference.py expects."""
    raws = requests(SHAPED[name](loop), delivery)
    assert engine(raws) == reference(raws)
    whole = requests(SHAPED[name](loop), Delivery("ended", 1, [False] * 8, None, [], 0))
    seen = engine(whole).counts
    assert (seen.cycles, seen.delegations) == CONVENTION_COUNTS[(name, loop)]


# --- transfers and labels that read back ----------------------------------------------------------

HANDOFF_HOPS = st.lists(
    st.tuples(st.sampled_from(("triage", "faq", "billing")), st.booleans()), min_size=1, max_size=7
)


@FORESTS
@given(HANDOFF_HOPS, st.sampled_from(transfers.STYLES), deliveries)
def test_any_chain_of_calls_and_handoffs_counts_as_the_reference(
    hops: list[tuple[str, bool]], style: str, delivery: Delivery
) -> None:
    """Chains of calls and transfers in the guard's spans, beside a runtime's, and in the
    conventions' transfer tools (tests/processor/reference/transfers.py), in any delivery."""
    raws = requests(transfers.spans(hops, style), delivery)
    assert engine(raws) == reference(raws)


def test_labels_escape_as_the_reference_escapes_and_read_back_alike() -> None:
    trace = Trace()
    parent = None
    for name in ("planner>budget", r"a\b", "c>", "planner>budget"):
        parent = trace.agent(name, parent)
    raws = [encode(*trace.spans)]
    ours = engine(raws)
    assert ours == reference(raws)
    ((_, label),) = ours.counts.cycles
    assert cycle_names(label) == label_names(label) == ["planner>budget", r"a\b", "c>", "planner>budget"]
    for label_ in ("", ">", "\\", "a\\", r"\\>\>", "x…", r"a\>b>c\\>d"):
        assert cycle_names(label_) == label_names(label_), label_
