"""The reference on its own: the right counts of the recordings, its table row by row, its forests.

The service's engine is held to the reference in ``tests/processor/engine/test_engine_vs_reference.py``
(every recording in every arrival order and field order, and the forests, with the names this module
gives it: ``RECORDINGS``, ``ENCODINGS``, ``KNOWN_FOREST_DIFFERENCES``, ``counts``). Here the reference
counts what ``corpus/README.md`` expects of every recording -- also of the runtimes the retired
pure-Python detector counted wrong (Google ADK's own spans, CrewAI's under OpenLLMetry) -- reads each
dialect row as documented, and counts alike in any delivery that loses nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from corpus_spans import CORPUS, read_spans, to_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.bounds import TREE_HOPS_BUCKETS
from processor_spans import Trace, encode
from test_corpus import ORDERS, VENDORS_NAMED
from test_value_first import value_first_request

from otel_guard.chain import Chain, TransferHop
from otel_guard.chain import Hop as GuardHop
from otel_guard.policy import decide
from otel_guard.settings import Settings
from reference import dialects, transfers
from reference.conventions import CLIENT, MCP_SCOPE, SERVER, Builder
from reference.conventions import FORESTS as SHAPED
from reference.dialects import AGENT, OPENINFERENCE_LANGCHAIN, TABLE, TOOL, Table
from reference.forests import (
    FIXED_STYLES,
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
from reference.reference import Metrics, detect, label_names
from reference.reference import label as label_of
from reference.transfers import Hop

RUNTIMES = CORPUS / "runtimes"
VENDORS = CORPUS / "vendors"
RECORDINGS = [
    *sorted(CORPUS.glob("*.spans.jsonl")),
    *sorted((CORPUS / "beside").glob("*.spans.jsonl")),
    *sorted(RUNTIMES.glob("*.spans.jsonl")),
    *sorted(VENDORS.glob("*.spans.jsonl")),
]
SWEEP = 1e12  # seconds: past every trace's TTL and every tool edge's wait
LOOP = {("cross_function", "planner>budget>planner"): 1}
LOOP_EDGES = {("planner", "budget"): 3, ("budget", "planner"): 2}
HEALTHY_EDGES = {("planner", "budget"): 1}
WHOLE = Delivery("started", 1, [False] * 8, None, [], 0)  # one request, key first


@dataclass(frozen=True)
class Counts:
    """What both count, comparably (the tree hops as the histogram the processor serves)."""

    cycles: dict[tuple[str, str], int]
    delegations: dict[tuple[str, str], int]
    decisions: dict[tuple[str, str, str], int]
    tree_hops: tuple[list[int], int]  # per bucket, and the sum
    received: int
    duplicates: int


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


# --- the recordings ------------------------------------------------------------------------------

# What the reference counts of the runtimes traced by their own telemetry and of the instrumentations
# recorded beside them (corpus/runtimes). The retired pure-Python detector counted the first two
# wrong: ADK's `invoke_workflow X` around `invoke_agent X` is one call (a wrapper wraps its call),
# CrewAI's `X.agent` spans are named by gen_ai.agent.name.
TOOL_LOOP = {("cross_function", "ask_budget>ask_planner>ask_budget"): 1}
HANDOFF_TOOLS = {("planner", "handoff"): 1, ("budget", "handoff"): 1}
TOOL_EDGES = {("ask_budget", "ask_planner"): 2, ("ask_planner", "ask_budget"): 2}
FINAL_ANSWERS = {("planner", "final_answer"): 3, ("budget", "final_answer"): 3}
RIGHT: dict[str, tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]] = {
    "runtimes/adk.loop": (LOOP, LOOP_EDGES),
    "runtimes/adk.control": ({}, HEALTHY_EDGES),
    "runtimes/crewai_tl.loop": (LOOP, LOOP_EDGES),
    "runtimes/crewai_tl.control": ({}, HEALTHY_EDGES),
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
    # Every agent span a child of the workflow root, none below the tool that ran it: each run read
    # as the run of the one tool span that provably started it (reference/flat.py) ...
    "runtimes/oai_tl.loop": (LOOP, LOOP_EDGES),
    "runtimes/oai_tl.control": ({}, HEALTHY_EDGES),
    # ... and none where two tool spans that ran at once both hold it: each tool call an edge.
    "runtimes/oai_tl.parallel": ({}, {("planner", "ask_budget"): 2}),
    # The observability SDKs' own decorators (corpus/vendors): their span kinds name agents and tools;
    # and their integrations with the agent runtimes that name both agents: Langfuse's and Phoenix's
    # (OpenInference's OpenAI Agents instrumentor), AgentOps' OpenAI Agents instrumentor (the name in
    # agent.name / tool.name), Logfire's pydantic-ai (pydantic-ai's own GenAI spans), Langfuse's
    # LangChain CallbackHandler over LangGraph (row 32: the graph's `chain` first below a tool), and
    # Laminar's LangGraph instrumentor (row 33: the graph's `execute_task X` first below a tool);
    # `_same`: the tools named like the agents they run, each tool and its run one hop.
    **{
        f"vendors/{vendor}.{scenario}": counted
        for vendor in VENDORS_NAMED
        for scenario, counted in (("loop", (LOOP, LOOP_EDGES)), ("control", ({}, HEALTHY_EDGES)))
    },
    # No agent named: Laminar has no agent type (its agents are DEFAULT spans, its OpenAI Agents
    # instrumentor's too), Phoenix's `@tracer.agent` span is named `planner` with no agent.name (as
    # unnamed as the OpenAI Agents SDK's `Agent workflow` root under OpenInference, which is no
    # agent), and MLflow's LangChain autolog writes each LangGraph graph a "CHAIN" like every node
    # in it; its pydantic-ai autolog names every agent run `Agent.run` (rows 28-31: no call): the
    # loop in tool names.
    **{
        f"vendors/{vendor}.{scenario}": counted
        for vendor in ("lmnr", "phoenix", "lmnr_oai", "mlflow_lg", "mlflow_pai")
        for scenario, counted in (
            ("loop", (TOOL_LOOP, {("ask_budget", "ask_planner"): 2, ("ask_planner", "ask_budget"): 2})),
            ("control", ({}, {})),
        )
    },
    # Logfire's spans are message templates the program chooses: no call without a dialects file
    # (docs/examples/dialects-logfire.yaml; tests/processor/dialects/test_corpus.py reads them so).
    "vendors/logfire.loop": ({}, {}),
    "vendors/logfire.control": ({}, {}),
    "vendors/logfire_oai.loop": ({}, {}),
    "vendors/logfire_oai.control": ({}, {}),
    # The official GenAI instrumentations (opentelemetry-instrumentation-genai-*): agents named
    # and nested below the tool that ran them.
    **{
        f"runtimes/{name}.{scenario}": counts
        for name in ("agno_genai", "smolagents_genai", "llama_index_genai", "lg_genai_agent")
        for scenario, counts in (("loop", (LOOP, LOOP_EDGES)), ("control", ({}, HEALTHY_EDGES)))
    },
    # OpenAI Agents: the workflow span (`invoke_workflow Agent workflow`) is the first name; a
    # handoff there and back writes sibling agent runs under it and no transfer (no cycle).
    "runtimes/oai_genai.loop": (LOOP, {**LOOP_EDGES, ("Agent workflow", "planner"): 1}),
    "runtimes/oai_genai.control": ({}, {**HEALTHY_EDGES, ("Agent workflow", "planner"): 1}),
    "runtimes/oai_genai.handoff": ({}, {("Agent workflow", "planner"): 2, ("Agent workflow", "budget"): 1}),
    # Qwen-Agent's Assistant runs its Memory agent in every run: an edge agent -> Memory per run.
    "runtimes/qwen_agent_genai.loop": (
        LOOP,
        {**LOOP_EDGES, ("planner", "Memory"): 3, ("budget", "Memory"): 3},
    ),
    "runtimes/qwen_agent_genai.control": (
        {},
        {**HEALTHY_EDGES, ("planner", "Memory"): 1, ("budget", "Memory"): 1},
    ),
    # LlamaIndex's AgentWorkflow likewise, each handoff a tool call `handoff` of the agent leaving.
    "runtimes/llama_index_genai.handoff": (
        {},
        {("AgentWorkflow", "planner"): 2, ("AgentWorkflow", "budget"): 1, **HANDOFF_TOOLS},
    ),
    # LangGraph's StateGraphs: only the top graph is named (`invoke_workflow planner`), the graphs
    # its tools run are not: the loop counts in its tools' names.
    "runtimes/lg_genai.loop": (TOOL_LOOP, {**TOOL_EDGES, ("planner", "ask_budget"): 1}),
    "runtimes/lg_genai.control": ({}, {("planner", "ask_budget"): 1}),
    # DSPy names every agent by its class (`invoke_agent dspy.ReAct`): no agent named (row 1).
    "runtimes/dspy_genai.loop": (TOOL_LOOP, TOOL_EDGES),
    "runtimes/dspy_genai.control": ({}, {}),
    # OpenLLMetry's LlamaIndex: every span a `task` named by class and method, the top one the
    # `FunctionAgent.workflow`; a tool call is the step task holding `tool.name`.
    "runtimes/llama_index_tl.loop": (TOOL_LOOP, {**TOOL_EDGES, ("FunctionAgent.workflow", "ask_budget"): 1}),
    "runtimes/llama_index_tl.control": ({}, {("FunctionAgent.workflow", "ask_budget"): 1}),
}


def recording(path: Path) -> str:
    folder = path.parent.relative_to(CORPUS).as_posix()
    name = path.name.removesuffix(".spans.jsonl")
    return name if folder == "." else f"{folder}/{name}"


ENCODINGS = {
    "key_first": lambda batch: to_request(batch).SerializeToString(),
    "value_first": value_first_request,
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("order", ORDERS, ids=lambda order: order.__name__)
@pytest.mark.parametrize("path", RECORDINGS, ids=recording)
def test_every_recording_counts_what_the_corpus_expects_in_any_order_and_field_order(
    path: Path, order: Any, encoding: str
) -> None:
    raws = [ENCODINGS[encoding](batch) for batch in order(read_spans(path))]
    ours = reference(raws)
    expected = RIGHT.get(recording(path))
    if expected is None:
        loop = path.name.endswith(".loop.spans.jsonl")
        assert ours.cycles == (LOOP if loop else {}) or recording(path).startswith("beside/")
        return
    assert (ours.cycles, ours.delegations) == expected


def test_the_runtimes_are_recordings_of_the_corpus() -> None:
    assert set(RIGHT) == {recording(path) for path in RECORDINGS if path.parent in (RUNTIMES, VENDORS)}


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

# A span (name, scope), its attributes, and the call it is: (kind, name, conditional), or None.
ROWS = [
    # GenAI operations (the span named otherwise)
    (("agent run", "any"), {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}, (AGENT, "a", False)),
    (("tool run", "any"), {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}, (TOOL, "t", False)),
    (("crew", "any"), {"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "w"}, (AGENT, "w", False)),
    (("invoke_agent", "any"), {"gen_ai.agent.name": "a"}, (AGENT, "a", False)),
    (("chat gpt-4o", "any"), {"gen_ai.operation.name": "chat"}, None),
    # OpenInference
    (("planner", "oi.x"), {"openinference.span.kind": "AGENT", "agent.name": "planner"}, (AGENT, "planner", False)),
    (("planner", "oi.x"), {"openinference.span.kind": "AGENT", "graph.node.id": "p"}, (AGENT, "p", False)),
    (("ask", "oi.x"), {"openinference.span.kind": "TOOL", "tool.name": "ask_budget"}, (TOOL, "ask_budget", False)),
    (("ask_budget", "oi.x"), {"openinference.span.kind": "TOOL"}, (TOOL, "ask_budget", False)),
    (("turn", "oi.x"), {"openinference.span.kind": "CHAIN"}, None),
    (("ChatModel", "oi.x"), {"openinference.span.kind": "LLM"}, None),
    # OpenInference for LangChain: the graph run (CHAIN) is the agent, its AGENT guess is not
    (("budget", OPENINFERENCE_LANGCHAIN), {"openinference.span.kind": "CHAIN"}, (AGENT, "budget", True)),
    (("agent", OPENINFERENCE_LANGCHAIN), {"openinference.span.kind": "AGENT"}, None),
    # OpenLLMetry / Traceloop
    (("planner.workflow", "tl"), {"traceloop.span.kind": "workflow", "traceloop.entity.name": "planner"}, (AGENT, "planner", False)),
    (("x.agent", "tl"), {"traceloop.span.kind": "agent", "traceloop.entity.name": "x"}, (AGENT, "x", False)),
    (("lookup.tool", "tl"), {"traceloop.span.kind": "tool", "traceloop.entity.name": "lookup"}, (TOOL, "lookup", False)),
    (("execute_task budget", "tl"), {"traceloop.span.kind": "task", "traceloop.entity.name": "budget", "gen_ai.operation.name": "execute_task"}, (AGENT, "budget", True)),
    # a dialect's kind first: Traceloop's workflow span carries a GenAI operation as well
    (("planner.workflow", "tl"), {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner", "traceloop.span.kind": "workflow", "traceloop.entity.name": "planner"}, (AGENT, "planner", False)),
    # CrewAI under OpenLLMetry: its agent spans name the agent in gen_ai.agent.name alone
    (("planner.agent", "tl"), {"traceloop.span.kind": "agent", "gen_ai.agent.name": "planner"}, (AGENT, "planner", False)),
    # The official DSPy instrumentation names every agent by its class: no name, in its scope alone
    (("invoke_agent dspy.ReAct", dialects.GENAI_DSPY), {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "dspy.ReAct"}, None),
    (("invoke_agent dspy.ReAct", "other"), {"gen_ai.agent.name": "dspy.ReAct"}, (AGENT, "dspy.ReAct", False)),
    # OpenLLMetry for LlamaIndex: the step task holding tool.name is the tool call, other tasks no call
    (("BaseWorkflowAgent.task", dialects.TRACELOOP_LLAMAINDEX), {"traceloop.span.kind": "task", "traceloop.entity.name": "BaseWorkflowAgent.task", "tool.name": "ask_budget"}, (TOOL, "ask_budget", False)),
    (("run.task", dialects.TRACELOOP_LLAMAINDEX), {"traceloop.span.kind": "task", "traceloop.entity.name": "run.task"}, None),
    # AgentOps' OpenAI Agents instrumentor: named after the agent or tool, the name in agent.name / tool.name
    (("planner", "openai-agents"), {"agentops.span.kind": "agent", "agent.name": "planner"}, (AGENT, "planner", False)),
    (("ask_budget", "openai-agents"), {"agentops.span.kind": "tool", "tool.name": "ask_budget"}, (TOOL, "ask_budget", False)),
    # MLflow's pydantic-ai autolog names every agent run after the method: no call, in its scope alone
    (("Agent.run_sync", dialects.MLFLOW_SCOPE), {"mlflow.spanType": '"AGENT"'}, None),
    (("Agent.run", dialects.MLFLOW_SCOPE), {"mlflow.spanType": '"AGENT"'}, None),
    (("Agent.run", "other"), {"mlflow.spanType": '"AGENT"'}, (AGENT, "Agent.run", False)),
    # Langfuse's LangChain CallbackHandler: a graph's (or node's) chain, an agent only first below a tool
    (("budget", "langfuse-sdk"), {"langfuse.observation.type": "chain"}, (AGENT, "budget", True)),
    # Laminar's LangGraph instrumentor: a graph's (or node's) execute_task, in its scope alone
    (("execute_task budget", dialects.LAMINAR_SCOPE), {"gen_ai.operation.name": "execute_task", "lmnr.span.type": "DEFAULT"}, (AGENT, "budget", True)),
    (("execute_task budget", "other"), {"gen_ai.operation.name": "execute_task"}, None),
]  # fmt: skip


@pytest.mark.parametrize(("span", "attributes", "expected"), ROWS)
def test_the_table_reads_each_row_as_documented(
    span: tuple[str, str], attributes: dict[str, str], expected: tuple[str, str, bool] | None
) -> None:
    ours = dialects.call_of(span[0], span[1], attributes)
    if expected is None:
        assert ours is None or ours.name is None
        return
    assert ours is not None
    assert (ours.kind, ours.name, ours.row.conditional) == expected


# --- forests -------------------------------------------------------------------------------------

FORESTS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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


def test_names_labels_and_paths_are_bounded() -> None:
    raws = [encode(*bounded())]
    ours = reference(raws)
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
@given(calls(STYLES), st.sampled_from([s for s in STYLES if s.startswith("guard")]), deliveries)
def test_lean_guard_spans_count_as_the_guards_spans_with_their_lists(
    call: Call, style: str, delivery: Delivery
) -> None:
    """A nested hop's span without the chain's lists (docs/spec.md §9) takes its path from its
    ancestors' spans: the counts are those of the same spans each naming its chain."""
    delivery = replace(delivery, lost=[])
    lean = detect(requests(spans_of(call, style), delivery))
    full = detect(requests(spans_of(call, style, lean=False), delivery))
    for counted in ("cycles", "returns", "delegations", "decisions", "trees"):
        assert getattr(lean, counted) == getattr(full, counted), counted


def test_the_forests_guard_spans_are_lean_where_the_guard_leaves_the_lists_out() -> None:
    """Planner -> ask_budget -> budget in one process, budget -> fx over HTTP, fx -> tax in a new
    trace, tax -> ask_planner -> planner: the hops nested in their previous hop's span are lean; the
    first, the arriving, the new trace's first and the would-refuse hop are not. The loop is counted
    in the new trace, through its lean tool hop, as a cross-trace one."""
    tax = Call("tax", hop="chain", calls=[Call(P, via="ask_planner")])
    call = Call(P, calls=[Call(B, via="ask_budget", calls=[Call("fx", hop="http", calls=[tax])])])
    guard = [
        (span.name, "otel_guard.chain.agents" in {kv.key for kv in span.attributes})
        for scope, span in spans_of(call, "guard")
        if scope == "otel_guard"
    ]
    assert guard == [
        ("invoke_agent planner", True),
        ("execute_tool ask_budget", False),
        ("invoke_agent budget", False),
        ("invoke_agent fx", True),
        ("invoke_agent tax", True),
        ("execute_tool ask_planner", False),
        ("invoke_agent planner", True),
    ]
    ours = detect(requests(spans_of(call, "guard"), WHOLE))
    assert ours.cycles == detect(requests(spans_of(call, "guard", lean=False), WHOLE)).cycles
    assert ours.cycles == Counter({("cross_trace", "planner>ask_budget>budget>fx>tax>planner"): 1})


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
    """A forest the retired pure-Python detector counted otherwise than the reference: the
    reference's count (right per docs/processor.md), the deliveries it was seen in with what that
    detector counted there (``today``, kept as the record of why the forest is here; the engine
    counts as the reference in each, test_engine_vs_reference.py), and why."""

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
    for delivery, _ in known.today:
        ours = reference(requests(known.spans(), delivery, known.keep_linked))
        assert ours.delegations == known.right, known.why
        if known.right_cycles is not None:
            assert ours.cycles == known.right_cycles, known.why


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


# --- transfers (reference/transfers.py) and labels that read back ---------------------------------

HAND_BACK: list[Hop] = [("triage", False), ("faq", True), ("triage", True)]
HAND_BACK_BY_CALLS: list[Hop] = [("triage", False), ("faq", False), ("triage", False)]
NOW = 1_000_000.0


def chained(hops: Sequence[Hop], style: str) -> Counts:
    return reference(requests(transfers.spans(hops, style), WHOLE))


@pytest.mark.parametrize("style", transfers.STYLES)
def test_a_hand_back_by_transfers_is_no_cycle_and_the_same_shape_by_calls_is_one(style: str) -> None:
    """triage ⇒ faq ⇒ triage by handoffs (the OpenAI Agents SDK's customer-service shape) is no
    loop: triage handed off and waits for nothing; by calls it is the loop it always was."""
    handed = chained(HAND_BACK, style)
    assert handed.cycles == {}
    assert handed.delegations == {("triage", "faq"): 1, ("faq", "triage"): 1}
    assert chained(HAND_BACK_BY_CALLS, style).cycles == {("cross_function", "triage>faq>triage"): 1}


@pytest.mark.parametrize("style", transfers.STYLES)
def test_a_return_to_an_agent_still_waiting_is_a_cycle_from_its_latest_waiting_place(style: str) -> None:
    # A transfer into an agent that waits (triage called faq, faq hands off to triage).
    into = [("triage", False), ("faq", False), ("triage", True)]
    assert chained(into, style).cycles == {("cross_function", "triage>faq>triage"): 1}
    # Handed back, triage calls billing, which calls triage: triage waits from its second place.
    back = [*HAND_BACK, ("billing", False), ("triage", False)]
    assert chained(back, style).cycles == {("cross_function", "triage>billing>triage"): 1}
    # faq, handed control, calls triage: triage handed off. faq handing off to itself: a new turn.
    assert chained([("triage", False), ("faq", True), ("triage", False)], style).cycles == {}
    assert chained([("faq", False), ("faq", True)], style).cycles == {}
    assert chained([("faq", False), ("faq", False)], style).cycles == {("direct", "faq>faq"): 1}


def test_a_ping_pong_of_transfers_is_no_cycle_in_the_processor() -> None:
    """The processor has no per-name depth: the guard stops a ping-pong of handoffs at
    max_name_depth, and the processor counts that refusal among the guard's decisions."""
    hops = [("triage", False), *[("faq", True), ("triage", True)] * 5]
    assert chained(hops, "guard").cycles == {}
    assert chained(hops, "conventions").cycles == {}


def _guard_says_cycle(hops: Sequence[Hop]) -> bool:
    """Whether the inline guard (cycle_rule agent) refuses any hop of ``hops`` as a cycle."""
    made = [TransferHop(agent) if transfer else GuardHop(agent) for agent, transfer in hops]
    settings_ = Settings(cycle_rule="agent", max_depth=64, observe_max_depth=64, max_name_depth=64)
    for at in range(1, len(made)):
        arrival = Chain(tuple(made[:at]), "ab" * 16, "default", NOW - 10, NOW + 290)
        if decide(arrival, made[at], settings_, NOW).reason == "cycle":
            return True
    return False


HOPS = st.lists(
    st.tuples(st.sampled_from(("triage", "faq", "billing")), st.booleans()), min_size=1, max_size=7
)


@FORESTS
@given(HOPS, st.sampled_from(transfers.STYLES), deliveries)
def test_the_reference_finds_a_loop_in_a_chain_exactly_where_the_guard_refuses_a_cycle(
    hops: list[Hop], style: str, delivery: Delivery
) -> None:
    """The guard's own rule (otel_guard.policy.waiting) as the oracle: a chain of calls and
    handoffs, however its spans are written and delivered, holds a loop for the processor exactly
    when the guard would refuse one of its hops as a cycle."""
    found = reference(requests(transfers.spans(hops, style), replace(delivery, lost=[]))).cycles
    assert bool(found) == _guard_says_cycle(hops), found


def test_a_name_holding_the_separator_or_the_escape_reads_back_from_its_label() -> None:
    # The agent `planner>budget` calling itself: one name, not a two-agent loop.
    trace = Trace()
    trace.agent("planner>budget", trace.agent("planner>budget"))
    (label,) = [label for _, label in reference([encode(*trace.spans)]).cycles]
    assert label == r"planner\>budget>planner\>budget"
    assert label_names(label) == ["planner>budget", "planner>budget"]
    # Backslashes: alone, last, and before a `>`.
    trace = Trace()
    parent = None
    for name in (r"a\b", "c", "d\\", r"e\>f", r"a\b"):
        parent = trace.agent(name, parent)
    (label,) = [label for _, label in reference([encode(*trace.spans)]).cycles]
    assert label == r"a\\b>c>d\\>e\\\>f>a\\b"
    assert label_names(label) == [r"a\b", "c", "d\\", r"e\>f", r"a\b"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab>\\…", max_size=6), min_size=1, max_size=6))
def test_any_label_within_its_bound_reads_back_into_its_names(names: list[str]) -> None:
    assert label_names(label_of(names)) == names
