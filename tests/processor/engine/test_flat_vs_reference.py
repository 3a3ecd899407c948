"""OpenLLMetry's flat OpenAI Agents traces, drawn by hypothesis: the engine against the reference.

A :class:`Run` tree (agents calling agents through tools, a run's tool calls one after another, all
at once, or staggered) is written as OpenLLMetry writes it -- every run below the workflow span,
each inside the tool span that ran it in time alone -- and as a nesting instrumentation would (each
run below its tool span). The engine counts what the reference counts of the flat spans in any
delivery; with no span lost, the flat reading counts no cycle that the nesting does not (never a
false one), and where no two tool calls overlap it counts exactly what the nesting counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import count

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from reference.flat import SCOPE
from reference.forests import Delivery, deliveries, requests
from test_engine_vs_reference import FORESTS, engine, reference

AGENTS = ("planner", "budget", "fx")
WIDTH = 10**12  # ns: the workflow's interval, room for four levels of calls
TRACE_ID = bytes(range(1, 17))


@dataclass
class Run:
    """An agent run and its tool calls, each running an agent (a Run) or nothing (None)."""

    agent: str
    mode: str = "sequential"  # its tool calls: "sequential", "parallel" (all at once) or "staggered"
    tools: list[Run | None] = field(default_factory=list)


def runs(depth: int = 4) -> st.SearchStrategy[Run]:
    leaf = st.builds(Run, st.sampled_from(AGENTS))
    modes = st.sampled_from(("sequential", "sequential", "parallel", "staggered"))

    def extend(inner: st.SearchStrategy[Run]) -> st.SearchStrategy[Run]:
        tools = st.lists(inner | st.none(), min_size=1, max_size=3)
        return st.builds(Run, st.sampled_from(AGENTS), modes, tools)

    return st.recursive(leaf, extend, max_leaves=8)


def flat_span(ids: count[int], parent: Span | None, kind: str, name: str, start: int, end: int) -> Span:
    span = Span(trace_id=TRACE_ID, span_id=next(ids).to_bytes(8, "big"))
    span.parent_span_id = parent.span_id if parent is not None else b""
    span.start_time_unix_nano, span.end_time_unix_nano = start, end
    span.name = {"workflow": "Agent Workflow", "agent": f"{name}.agent", "tool": f"{name}.tool"}[kind]
    attributes = {"traceloop.span.kind": kind}
    if kind == "agent":
        attributes["gen_ai.agent.name"] = name
    elif kind == "tool":
        attributes["gen_ai.tool.name"] = name
    for key, text in attributes.items():
        pair = KeyValue(key=key)
        pair.value.string_value = text
        span.attributes.append(pair)
    return span


def slots(mode: str, start: int, end: int, calls: int) -> list[tuple[int, int]]:
    """The intervals of a run's tool calls within the run's [start, end]."""
    if mode == "parallel":  # all at once: each holds the others' runs
        return [(start + 1 + at, end - 1 - at) for at in range(calls)]
    if mode == "staggered":  # each overlapping the next by half, holding none of its runs
        width = (end - start) // (calls + 2)
        return [(start + 1 + at * width, start + (at + 2) * width - 1) for at in range(calls)]
    width = (end - start) // max(calls, 1)
    return [(start + 1 + at * width, start + (at + 1) * width - 1) for at in range(calls)]


def spans_of(top: Run, nested: bool = False) -> list[tuple[str, Span]]:
    """The spans of a run tree in the order they started: flat (every run below the workflow
    span), or ``nested`` (each run below the tool span that ran it)."""
    ids = count(1)
    out: list[Span] = []
    workflow = flat_span(ids, None, "workflow", "", 0, WIDTH)
    out.append(workflow)

    def render(run: Run, above: Span, start: int, end: int) -> None:
        span = flat_span(ids, above, "agent", run.agent, start, end)
        out.append(span)
        for tool, (begin, finish) in zip(run.tools, slots(run.mode, start, end, len(run.tools)), strict=True):
            name = f"ask_{tool.agent}" if tool is not None else "search"
            tool_span = flat_span(ids, span, "tool", name, begin, finish)
            out.append(tool_span)
            if tool is not None:
                render(tool, tool_span if nested else workflow, begin + 10, finish - 10)

    render(top, workflow, 1, WIDTH - 1)
    out.sort(key=lambda span: span.start_time_unix_nano)
    return [(SCOPE, span) for span in out]


def overlapping(run: Run) -> bool:
    return (run.mode != "sequential" and len(run.tools) > 1) or any(
        overlapping(tool) for tool in run.tools if tool is not None
    )


@FORESTS
@given(runs(), deliveries)
def test_any_flat_trace_in_any_delivery_counts_as_the_reference(top: Run, delivery: Delivery) -> None:
    raws = requests(spans_of(top), delivery)
    assert engine(raws) == reference(raws)


@FORESTS
@given(runs(), deliveries)
def test_a_flat_trace_counts_no_cycle_its_nesting_does_not_and_all_of_them_where_no_calls_overlap(
    top: Run, delivery: Delivery
) -> None:
    delivery = replace(delivery, lost=[])
    flat = engine(requests(spans_of(top), delivery)).counts
    nested = engine(requests(spans_of(top, nested=True), delivery)).counts
    assert set(flat.cycles) <= set(nested.cycles)
    if not overlapping(top):
        assert flat == nested


def test_the_strategies_draw_loops_and_overlapping_calls() -> None:
    """The properties above see both sides: a loop read back call by call, and overlapping calls
    whose run is left unattributed (so its loop goes unseen rather than guessed)."""
    loop = Run("planner", tools=[Run("budget", tools=[Run("planner")])])
    delivery = Delivery("ended", 1, [False] * 8, None, [], 0)
    assert engine(requests(spans_of(loop), delivery)).counts.cycles == {
        ("cross_function", "planner>budget>planner"): 1
    }
    parallel = Run("planner", "parallel", [Run("budget", tools=[Run("planner")]), None])
    flat = engine(requests(spans_of(parallel), delivery)).counts
    nested = engine(requests(spans_of(parallel, nested=True), delivery)).counts
    assert (flat.cycles, nested.cycles) == ({}, {("cross_function", "planner>budget>planner"): 1})


def test_a_traces_runs_past_the_bound_stay_unattributed_as_the_reference_leaves_them() -> None:
    """A chain of 300 runs, planner and budget by turns: the first 256 read back call by call
    (the loop counted), the rest left below the workflow span, in the engine as in the reference."""
    top = Run("planner")
    at = top
    for depth in range(1, 300):
        at.tools = [Run(AGENTS[depth % 2])]
        at = at.tools[0]
    spans = spans_of(top)
    for delivery in (
        Delivery("ended", 1, [False] * 8, None, [], 0),
        Delivery("shuffled", 7, [True] * 8, 2, [], 5),
    ):
        raws = requests(spans, delivery)
        seen = engine(raws)
        assert seen == reference(raws)
        assert seen.counts.cycles == {("cross_function", "planner>budget>planner"): 1}
        # 255 calls read back (the first run is no call), the other 44 tool calls edges of their own.
        assert seen.counts.delegations == {
            ("planner", "budget"): 128,
            ("budget", "planner"): 127,
            ("planner", "ask_budget"): 22,
            ("budget", "ask_planner"): 22,
        }
