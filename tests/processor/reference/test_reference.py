"""The detector against the reference: the same counts from every recording and every forest.

Today's :class:`~otel_guard_processor.detector.Detector` is fed through its public ingest path, the
requests in the order given at one instant, then swept once everything may go (its traces evicted:
orphans settle and tool edges count; its trees let go). The reference reads the same requests.
They must agree on every recording of ``tests/processor/dialects/corpus`` in every arrival order
and field order, and on hypothesis-drawn span forests delivered in random orders, batches, retries,
losses and field orders -- except where :data:`KNOWN_DIFFERENCES` says why the reference is right.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from corpus_spans import CORPUS, read_spans, to_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.detector import TREE_HOPS_BUCKETS, Detector
from otel_guard_processor.dialects import call_by_attributes
from otel_guard_processor.otlp import parse_request
from processor_spans import Trace, encode
from test_corpus import ORDERS
from test_dialects import ROWS, encoded
from test_value_first import value_first_request

from reference import dialects
from reference.conventions import CLIENT, MCP_SCOPE, SERVER, Builder
from reference.conventions import FORESTS as SHAPED
from reference.dialects import TABLE, Row, Table
from reference.forests import (
    FIXED_STYLES,
    ROOTS,
    STYLES,
    Call,
    Context,
    Delivery,
    Forest,
    calls,
    deliveries,
    requests,
    spans_of,
)
from reference.reference import Metrics, detect

RUNTIMES = CORPUS / "runtimes"
RECORDINGS = [
    *sorted(CORPUS.glob("*.spans.jsonl")),
    *sorted((CORPUS / "beside").glob("*.spans.jsonl")),
    *sorted(RUNTIMES.glob("*.spans.jsonl")),
]
SWEEP = 1e12  # seconds: past every trace's TTL and every tool edge's wait
LOOP = {("cross_function", "planner>budget>planner"): 1}
LOOP_EDGES = {("planner", "budget"): 3, ("budget", "planner"): 2}
HEALTHY_EDGES = {("planner", "budget"): 1}
WHOLE = Delivery("started", 1, [False] * 8, None, [], 0)  # one request, key first
# Recorded for the reference and the engine alone (the detector goes, issue 24): what each counts.
TOOL_LOOP = {("cross_function", "ask_budget>ask_planner>ask_budget"): 1}
FINAL_ANSWERS = {("planner", "final_answer"): 3, ("budget", "final_answer"): 3}
SHAPES: dict[str, tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]] = {
    "runtimes/strands.loop": (LOOP, LOOP_EDGES),
    "runtimes/strands.control": ({}, HEALTHY_EDGES),
    "runtimes/strands_oi.loop": (LOOP, LOOP_EDGES),
    "runtimes/strands_oi.control": ({}, HEALTHY_EDGES),
    "runtimes/agno_oi.loop": (LOOP, LOOP_EDGES),
    "runtimes/agno_oi.control": ({}, HEALTHY_EDGES),
    # Agents named by the span name alone (`planner.run`); each run ends in its final_answer tool.
    "runtimes/smolagents_oi.loop": (LOOP, {**LOOP_EDGES, **FINAL_ANSWERS}),
    "runtimes/smolagents_oi.control": (
        {},
        {**HEALTHY_EDGES, ("planner", "final_answer"): 1, ("budget", "final_answer"): 1},
    ),
    # No agent named anywhere (`FunctionAgent.run`, a CHAIN): the loop in its tools' names.
    "runtimes/llama_index_oi.loop": (
        TOOL_LOOP,
        {("ask_budget", "ask_planner"): 2, ("ask_planner", "ask_budget"): 2},
    ),
    "runtimes/llama_index_oi.control": ({}, {}),
    # Every agent span a child of the workflow root, none below the tool that ran it: no loop
    # to see, each agent's tool call an edge of its own.
    "runtimes/oai_tl.loop": ({}, {("planner", "ask_budget"): 3, ("budget", "ask_planner"): 2}),
    "runtimes/oai_tl.control": ({}, {("planner", "ask_budget"): 1}),
}


@dataclass(frozen=True)
class Counts:
    """What both count, comparably (the tree hops as the histogram the processor serves)."""

    cycles: dict[tuple[str, str], int]
    delegations: dict[tuple[str, str], int]
    decisions: dict[tuple[str, str, str], int]
    tree_hops: tuple[list[int], int]  # per bucket, and the sum
    received: int
    duplicates: int


def today(raws: Sequence[bytes]) -> Counts:
    detector = Detector()
    received = 0
    for raw in raws:
        received += detector.ingest(parse_request(raw), raw, 0.0)
    detector.expire(SWEEP)
    detector.release_trees()
    return Counts(
        detector.cycles,
        detector.delegations,
        detector.decisions,
        (detector.tree_hops, detector.tree_hops_sum),
        received,
        detector.duplicates,
    )


def counts(metrics: Metrics) -> Counts:
    buckets = [0] * (len(TREE_HOPS_BUCKETS) + 1)
    for hops in metrics.trees.values():
        buckets[bisect_left(TREE_HOPS_BUCKETS, hops)] += 1
    return Counts(
        metrics.cycles,
        metrics.delegations,
        metrics.decisions,
        (buckets, sum(metrics.trees.values())),
        metrics.received,
        metrics.duplicates,
    )


def reference(raws: Sequence[bytes], table: Table = TABLE) -> Counts:
    return counts(detect(raws, table))


# --- what today's detector does otherwise --------------------------------------------------------

TL_AGENT_NAME = (
    "OpenLLMetry's CrewAI spans `X.agent` carry traceloop.span.kind agent and gen_ai.agent.name but no "
    "traceloop.entity.name: the detector finds no name, so no call; the reference's Traceloop rows "
    "fall back to the GenAI name (the unnamed crewai.workflow and task spans stay links)"
)
WRAPPER_ROWS = (
    "The detector reads every GenAI span name (invoke_agent, invoke_workflow, execute_tool) as one "
    "form, and any two forms of one instrumentation nested either way as one call. So ADK's "
    "`invoke_workflow X` around `invoke_agent X` is a re-entry to it, and an `invoke_workflow X` (or "
    "Traceloop's `invoke_agent X`) that the run of X starts inside its own `invoke_agent X` (or "
    "`X.workflow`) is the same call to it. The reference's rows are forms of their own, and a wrapper "
    "wraps its call (dialects.WRAPPERS), not the other way round"
)


def today_table() -> Table:
    """The dialect table as today's detector reads it: the reference's without its fixes (and
    without what came after it: the span name's stem, the protocol rows, a tool span named by
    gen_ai.tool.name before its span name)."""
    kind_rows = tuple(
        replace(row, names=(dialects.TL_NAME,))
        if row.key == dialects.TL_KIND
        else replace(row, names=tuple(name for name in row.names if name != dialects.STEM))
        for row in dialects.KIND_ROWS
    )

    def rows(key: str, *values: str) -> tuple[Row, ...]:
        return tuple(row for row in kind_rows if row.key == key and row.value in values and row.scope is None)

    forms = (
        dialects.NAME_ROWS,
        dialects.OPERATION_ROWS,
        rows(dialects.OI_KIND, "AGENT", "TOOL"),
        rows(dialects.TL_KIND, "agent", "workflow", "tool"),
    )
    name_rows = tuple(
        replace(row, names=(dialects.SUBJECT, "gen_ai.tool.name")) if row.value == "execute_tool" else row
        for row in dialects.NAME_ROWS
    )
    forms = (name_rows, *forms[1:])
    return Table(name_rows, kind_rows, protocol_rows=(), wrappers=(), forms=forms)


# The reference, with the fixes it makes undone, is today's detector: in every recording and
# every forest (the fixes are these, and only these).
TODAY = today_table()
FIXES = {"traceloop_agent_name": TL_AGENT_NAME, "wrapper_rows": WRAPPER_ROWS}


# --- the recordings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """A recording today's detector counts wrong: what it counts, and the fix that makes it right."""

    cycles: dict[tuple[str, str], int]
    delegations: dict[tuple[str, str], int]
    fix: str  # a key of FIXES


ADK_LOOP_TODAY = {
    ("direct", "planner>planner"): 1,
    ("direct", "budget>budget"): 1,
    ("cross_function", "planner>budget>budget>planner"): 1,
    ("cross_function", "budget>planner>planner>budget"): 1,
}
ADK_LOOP_EDGES_TODAY = {
    ("planner", "planner"): 3,
    ("planner", "budget"): 3,
    ("budget", "budget"): 3,
    ("budget", "planner"): 2,
}
KNOWN_DIFFERENCES: dict[str, Difference] = {
    "runtimes/adk.loop": Difference(ADK_LOOP_TODAY, ADK_LOOP_EDGES_TODAY, "wrapper_rows"),
    "runtimes/adk.control": Difference(
        {("direct", "planner>planner"): 1, ("direct", "budget>budget"): 1},
        {("planner", "planner"): 1, ("planner", "budget"): 1, ("budget", "budget"): 1},
        "wrapper_rows",
    ),
    "runtimes/crewai_tl.loop": Difference({}, {}, "traceloop_agent_name"),
    "runtimes/crewai_tl.control": Difference({}, {}, "traceloop_agent_name"),
}
# What the reference counts of them: what the corpus's README expects of every recording.
RIGHT = {
    "runtimes/adk.loop": (LOOP, LOOP_EDGES),
    "runtimes/adk.control": ({}, HEALTHY_EDGES),
    "runtimes/crewai_tl.loop": (LOOP, LOOP_EDGES),
    "runtimes/crewai_tl.control": ({}, HEALTHY_EDGES),
}


def recording(path: Path) -> str:
    folder = path.parent.relative_to(CORPUS).as_posix()
    name = path.name.removesuffix(".spans.jsonl")
    return name if folder == "." else f"{folder}/{name}"


ENCODINGS = {
    "key_first": lambda batch: to_request(batch).SerializeToString(),
    "value_first": value_first_request,
}


DETECTOR_RECORDINGS = [path for path in RECORDINGS if recording(path) not in SHAPES]


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("path", DETECTOR_RECORDINGS, ids=recording)
def test_every_recording_counts_alike_in_any_order_and_field_order(
    path: Path, order: Any, encoding: str
) -> None:
    raws = [ENCODINGS[encoding](batch) for batch in order(read_spans(path))]
    ours, theirs = reference(raws), today(raws)
    assert theirs == reference(raws, TODAY)
    known = KNOWN_DIFFERENCES.get(recording(path))
    if known is None:
        assert theirs == ours
        return
    assert (ours.cycles, ours.delegations) == RIGHT[recording(path)], FIXES[known.fix]
    assert (theirs.cycles, theirs.delegations) == (known.cycles, known.delegations), (
        "the detector no longer counts what KNOWN_DIFFERENCES says: check it counts as the "
        "reference does, and take the recording off the list"
    )


@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_recordings_the_detector_never_read_count_as_the_readme_says(name: str, order: Any) -> None:
    raws = [ENCODINGS["key_first"](batch) for batch in order(read_spans(CORPUS / f"{name}.spans.jsonl"))]
    ours = reference(raws)
    assert (ours.cycles, ours.delegations) == SHAPES[name]


def test_the_shapes_are_the_recordings_the_detector_test_leaves_out() -> None:
    assert {recording(path) for path in RECORDINGS} - {
        recording(path) for path in DETECTOR_RECORDINGS
    } == set(SHAPES)


def test_the_known_differences_are_recordings_of_the_corpus() -> None:
    assert set(KNOWN_DIFFERENCES) <= {recording(path) for path in RECORDINGS}
    assert set(RIGHT) == set(KNOWN_DIFFERENCES)
    assert {known.fix for known in KNOWN_DIFFERENCES.values()} == set(FIXES)


@pytest.mark.parametrize(
    ("name", "returned"),
    [("runtimes/adk.loop", "execute_tool planner"), ("runtimes/crewai_tl.loop", "planner.agent")],
)
def test_a_loops_count_carries_the_span_where_the_name_first_returned(name: str, returned: str) -> None:
    records = read_spans(CORPUS / f"{name}.spans.jsonl")
    metrics = detect([to_request(records).SerializeToString()])
    ((trace_id, span_id),) = metrics.returns[("cross_function", "planner>budget>planner")]
    by_id = {record["span_id"]: record for record in records}
    span = by_id[span_id]
    assert (span["trace_id"], span["name"]) == (trace_id, returned)
    ancestors = []
    parent = span["parent_id"]
    while parent:
        ancestors.append(by_id[parent]["name"])
        parent = by_id[parent]["parent_id"]
    # The first return: one planner run above it (the loop's start), no earlier return.
    assert sum(name.endswith(("agent planner", "planner.agent")) for name in ancestors) == 1


# --- the dialect table ---------------------------------------------------------------------------


@pytest.mark.parametrize(("span", "attributes", "expected"), ROWS)
def test_the_table_reads_each_row_of_the_detectors_table_alike(
    span: tuple[str, str], attributes: dict[str, str], expected: Any
) -> None:
    theirs = call_by_attributes(span[0], span[1], encoded(span[0], **attributes))
    text = {key.replace("__", "."): value for key, value in attributes.items()}
    ours = dialects.call_of(span[0], span[1], text)
    if theirs is None:
        assert ours is None or ours.name is None
        return
    assert ours is not None
    kinds = {1: dialects.AGENT, 2: dialects.TOOL}
    assert (ours.kind, ours.name, ours.row.conditional) == (
        kinds[theirs.kind],
        theirs.name,
        theirs.conditional,
    )


# --- forests -------------------------------------------------------------------------------------

FORESTS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FORESTS
@given(calls(STYLES), st.sampled_from(STYLES), deliveries, st.sampled_from(ROOTS))
def test_any_forest_in_any_delivery_counts_alike(
    call: Call, style: str, delivery: Delivery, root: str
) -> None:
    raws = requests(spans_of(call, style, root), delivery)
    theirs, ours = today(raws), reference(raws, TODAY)
    # (Which turn of a loop names it: KNOWN_FOREST_DIFFERENCES; the reference's own is checked below.)
    assert replace(theirs, cycles=turned(theirs.cycles)) == replace(ours, cycles=turned(ours.cycles))


def turned(cycles: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """The cycles, each label from the least rotation of its loop (a label cut short as it is)."""
    turned: dict[tuple[str, str], int] = {}
    for (kind, label), count in cycles.items():
        loop = label.split(">")[:-1]
        least = min(loop[at:] + loop[:at] for at in range(len(loop)))
        key = (kind, label if label.endswith("…") else ">".join([*least, least[0]]))
        turned[key] = turned.get(key, 0) + count
    return turned


def bounded() -> list[Span]:
    """Names past their bound (a label of six long names), and a path past its 64 names."""
    trace = Trace()
    parent = first = trace.agent("p" * 100_000)
    for index in range(5):
        parent = trace.agent(f"{index:03d}" + "x" * 300, parent)
    trace.agent("p" * 100_000, parent)
    parent = trace.agent("agent-0", first)
    for index in range(1, 84):
        parent = trace.agent(f"agent-{index}", parent)
    trace.agent("agent-0", parent)  # beyond the names kept: no cycle
    trace.agent("agent-83", parent)
    return trace.spans


def test_names_labels_and_paths_are_bounded_alike() -> None:
    raws = [encode(*bounded())]
    ours = reference(raws)
    assert ours == today(raws)
    ((kind, label), (deep, _)) = sorted(ours.cycles)
    assert (kind, deep, len(label)) == ("cross_function", "direct", 1024)
    assert label.endswith("…")


@FORESTS
@given(calls(STYLES), st.sampled_from(STYLES), deliveries)
def test_the_reference_counts_alike_in_any_delivery_that_loses_nothing(
    call: Call, style: str, delivery: Delivery
) -> None:
    spans = spans_of(call, style)
    delivered = detect(requests(spans, replace(delivery, lost=[])))
    whole = detect(requests(spans, WHOLE))
    for counted in ("cycles", "returns", "delegations", "decisions", "trees"):
        assert getattr(delivered, counted) == getattr(whole, counted), counted


@FORESTS
@given(calls(("genai",), hops=("in_process",)), st.sampled_from(FIXED_STYLES), deliveries)
def test_the_fixed_runtimes_count_as_the_same_calls_in_genai_spans(
    call: Call, style: str, delivery: Delivery
) -> None:
    """Agents calling agents, in Google ADK's spans or CrewAI's under OpenLLMetry, count what the
    same calls count written in the GenAI conventions (CrewAI writes no tool spans: the calls here
    call no tool that runs no agent, and each tool is named like the agent it runs, or ask_ it)."""

    def agents_only(call: Call) -> Call:
        via = call.via if call.via in (None, call.agent) else f"ask_{call.agent}"
        return Call(call.agent, via, "in_process", None, [agents_only(below) for below in call.calls])

    call, delivery = agents_only(call), replace(delivery, lost=[])
    genai = detect(requests(spans_of(call, "genai"), delivery))
    fixed = detect(requests(spans_of(call, style), delivery))
    assert (fixed.cycles, fixed.delegations) == (genai.cycles, genai.delegations)


# --- what the forests leave out: differences, each shown by one forest ------------------------------


def planner_reentered_and_asked_again_beside_the_guard() -> list[tuple[str, Span]]:
    """The guard's spans around pydantic-ai's: planner runs planner over HTTP (pydantic-ai only in
    that process), and asks itself again through a tool named planner."""
    forest = Forest()
    context = Context(forest.trace_id(), "guard_runtime")
    run = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"}
    top, below = forest.guard_hop(context, "planner", None, tool=False)
    planner = forest.span(below, "invoke_agent planner", top, run, style="genai")
    client = forest.span(below, "POST", planner, kind=Span.SPAN_KIND_CLIENT, style="http")
    server = forest.span(below, "POST /a2a", client, kind=Span.SPAN_KIND_SERVER, style="http")
    forest.span(below, "invoke_agent planner", server, run, style="genai")
    tool, under = forest.guard_hop(below, "planner", planner, tool=True)
    forest.span(under, "invoke_agent planner", tool, run, style="genai")
    return forest.spans


P, B = "planner", "budget"


@dataclass(frozen=True)
class ForestDifference:
    """A forest today's detector counts otherwise than the reference: the reference's count (right
    per docs/processor.md), today's in each delivery, and why."""

    spans: Callable[[], list[tuple[str, Span]]]
    right: dict[tuple[str, str], int]  # the delegation edges (and, where listed, the cycles)
    today: list[tuple[Delivery, dict[tuple[str, str], int]]]
    why: str
    right_cycles: dict[tuple[str, str], int] | None = None
    today_cycles: list[dict[tuple[str, str], int]] | None = None
    keep_linked: bool = True  # (forests.requests)


ONE = Delivery("started", 1, [False] * 8, None, [], 0)
SPLIT = Delivery("started", 2, [False] * 8, None, [0], 0)  # the root lost, the rest in two requests
KNOWN_FOREST_DIFFERENCES = {
    "a merged tool call's source": ForestDifference(
        lambda: spans_of(Call(P, calls=[Call(P)], tools=[P]), "guard_runtime_tools"),
        {(P, P): 2},
        [(ONE, {(P, P): 1}), (replace(ONE, order="ended"), {(P, P): 1})],
        "planner calls a tool named planner (no agent run) and runs planner: two calls. The guard's "
        "span of the tool holds pydantic-ai's, and the detector counts the tool call as pydantic-ai's "
        "(its innermost span's, where an agent call is its outermost's), so beside the guard's agent "
        "call at the same path it weighs as the same call. The reference counts each call as its "
        "first span's source, and tool calls apart from agent calls. The forests draw the guard's "
        "tool spans alone",
    ),
    "tool and agent calls at one path, two sources": ForestDifference(
        planner_reentered_and_asked_again_beside_the_guard,
        {(P, P): 2},
        [
            (ONE, {(P, P): 1}),
            (replace(ONE, order="ended"), {(P, P): 1}),
            (replace(ONE, batches=8), {(P, P): 2}),
        ],
        "Two calls planner -> planner: pydantic-ai's run over HTTP, and the guard's tool planner "
        "that runs planner. The tool's record (no edge of its own) and the agent calls stand at one "
        "path, and the detector tallies them together: whether pydantic-ai's run counts depends on "
        "the arrival order. The reference tallies tool calls and agent calls apart. The forests draw "
        "no guarded and unguarded processes in one trace, nor tools named like an agent their "
        "caller runs otherwise (corpus/beside holds the guard beside other instrumentations)",
    ),
    "which turn names a loop": ForestDifference(
        lambda: spans_of(
            Call(
                "fx",
                calls=[Call(P, calls=[Call(B, calls=[Call(P)])]), Call(B, calls=[Call(P, calls=[Call(B)])])],
            ),
            "genai",
        ),
        {("fx", P): 1, (P, B): 2, (B, P): 2, ("fx", B): 1},
        [
            (
                replace(ONE, batches=3, order="shuffled", seed=seed),
                {("fx", P): 1, (P, B): 2, (B, P): 2, ("fx", B): 1},
            )
            for seed in (0, 1)
        ],
        "fx runs planner, which runs budget, which runs planner; and budget, which runs planner, "
        "which runs budget: one loop, counted once in the trace, labelled from the first name that "
        "returned -- for the reference the return that started first (planner's), for the detector "
        "the one it settled first, which depends on the arrival order",
        right_cycles={("cross_function", "planner>budget>planner"): 1},
        today_cycles=[
            {("cross_function", "planner>budget>planner"): 1},
            {("cross_function", "budget>planner>budget"): 1},
        ],
    ),
    "a linked trace's parent lost": ForestDifference(
        lambda: spans_of(
            Call(P, calls=[Call(P, calls=[Call(P), Call(P, calls=[Call(P), Call(P, hop="link")])]), Call(P)]),
            "genai",
        ),
        {(P, P): 4},
        [(replace(SPLIT, batches=1), {(P, P): 4}), (SPLIT, {(P, P): 3})],
        "The root of a trace is lost; another trace's root links to a span below it. At eviction "
        "the span settles as the orphans do, and the linking root continues its path -- unless the "
        "linking trace is evicted first (it was active later: the second request), which settles "
        "its spans as roots and drops the linking root uncounted. The reference continues the "
        "link whatever the order. The forests lose no span above one another trace links to",
        right_cycles={("direct", "planner>planner"): 1, ("cross_trace", "planner>planner"): 1},
        today_cycles=[
            {("direct", "planner>planner"): 1, ("cross_trace", "planner>planner"): 1},
            {("direct", "planner>planner"): 1},
        ],
        keep_linked=False,
    ),
}


@pytest.mark.parametrize("name", sorted(KNOWN_FOREST_DIFFERENCES))
def test_what_the_forests_leave_out_counts_as_documented(name: str) -> None:
    known = KNOWN_FOREST_DIFFERENCES[name]
    for at, (delivery, edges) in enumerate(known.today):
        raws = requests(known.spans(), delivery, known.keep_linked)
        ours, theirs = reference(raws), today(raws)
        assert ours.delegations == known.right, known.why
        assert theirs.delegations == edges, (delivery, "the detector counts otherwise now: update the list")
        if known.right_cycles is not None and known.today_cycles is not None:
            assert (ours.cycles, theirs.cycles) == (known.right_cycles, known.today_cycles[at])


# --- the newest conventions' shapes (reference/conventions.py) ----------------------------------

WORKFLOW_EDGES = {("offsite_workflow", "planner"): 1}
CONVENTION_COUNTS = {
    **{(name, True): (LOOP, LOOP_EDGES) for name in SHAPED},
    **{(name, False): ({}, HEALTHY_EDGES) for name in SHAPED},
    # The workflow is the first name of each path; the healthy one runs budget after planner.
    ("workflow", True): (LOOP, {**LOOP_EDGES, **WORKFLOW_EDGES}),
    ("workflow", False): ({}, {**HEALTHY_EDGES, **WORKFLOW_EDGES, ("offsite_workflow", "budget"): 1}),
    # Handoffs beside each other: no agent below another, so no loop to see; each transfer is a
    # tool call of its source, named by gen_ai.tool.name (not the span name's target).
    ("handoff", True): (
        {},
        {
            ("offsite_workflow", "planner"): 3,
            ("offsite_workflow", "budget"): 3,
            ("planner", "transfer_to_budget"): 3,
            ("budget", "transfer_to_planner"): 2,
        },
    ),
    ("handoff", False): (
        {},
        {
            ("offsite_workflow", "planner"): 1,
            ("offsite_workflow", "budget"): 1,
            ("planner", "transfer_to_budget"): 1,
        },
    ),
}


@pytest.mark.parametrize("loop", [True, False], ids=["loop", "healthy"])
@pytest.mark.parametrize("name", sorted(SHAPED))
def test_the_conventions_shapes_count_each_loop_once_and_healthy_runs_nothing(name: str, loop: bool) -> None:
    """Workflows as invoke_agent spans, transfers, A2A and MCP client and server spans (one call
    each), and a CLIENT span naming its caller (gen_ai.caller.name), in any delivery."""
    for order in ("started", "ended", "shuffled"):
        raws = requests(SHAPED[name](loop), Delivery(order, 3, [False, True] * 4, None, [], 7))
        ours = reference(raws)
        assert (ours.cycles, ours.delegations) == CONVENTION_COUNTS[(name, loop)], order


def test_without_the_protocol_rows_spans_named_by_their_method_alone_are_no_calls() -> None:
    """A2A spans and MCP spans with no gen_ai.operation.name are read by their method: without
    those rows, agents known only by their A2A spans are not seen (nor their loop), and an MCP
    tool call makes no edge."""
    without = replace(TABLE, protocol_rows=())
    raws = requests(SHAPED["a2a_alone"](True), WHOLE)
    assert (reference(raws).cycles, reference(raws, without).cycles) == (LOOP, {})
    spans = Builder()
    search = {"mcp.method.name": "tools/call", "jsonrpc.request.id": "1"}
    client = spans.span(
        "tools/call search", spans.agent("planner", None), search, kind=CLIENT, scope=MCP_SCOPE
    )
    spans.span("tools/call search", client, search, kind=SERVER, scope=MCP_SCOPE)
    raws = requests(spans.forest, WHOLE)
    assert reference(raws).delegations == {("planner", "search"): 1}
    assert reference(raws, without).delegations == {}
