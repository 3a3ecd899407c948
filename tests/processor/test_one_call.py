"""One call is one hop, one loop is one series: the detector's rules for the spans that record a call.

docs/spec.md §6: a tool that runs an agent, two instrumentations' spans of one call, a wrapper span, the
client and server sides of a remote call are one hop; a name that returns through a new call is a
cycle; a loop that bounces counts once, in agent names.
"""

from __future__ import annotations

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.engine import EngineDetector
from processor_spans import CLIENT, SERVER, Trace, encode

OI_LANGCHAIN = "openinference.instrumentation.langchain"
TRACELOOP_LANGCHAIN = "opentelemetry.instrumentation.langchain"


def detect(*batches: list[Span]) -> EngineDetector:
    detector = EngineDetector()
    for batch in batches:
        raw = encode(*batch)
        detector.ingest(raw, 0.0)
    detector.expire(detector.limits.count_wait)  # the tool edges' wait is over
    return detector


def oi(trace: Trace, name: str, kind: str, parent: Span | None = None, **attributes: str) -> Span:
    """An OpenInference span of LangChain's instrumentation."""
    return trace.span(
        name, parent, scope=OI_LANGCHAIN, attributes={"openinference.span.kind": kind, **attributes}
    )


def test_a_tool_that_runs_an_agent_of_the_same_name_is_one_hop() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    tool = trace.tool("budget", planner)
    trace.agent("budget", tool)
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 1}


def test_a_tool_that_runs_an_agent_of_another_name_makes_the_edge_to_the_agent() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    tool = trace.tool("ask_budget", planner)
    trace.agent("budget", trace.span("turn", tool))
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 1}


def test_a_tool_that_runs_no_agent_keeps_its_edge_once_its_wait_is_over() -> None:
    trace = Trace()
    trace.tool("search", trace.agent("planner"))
    raw = encode(*trace.spans)
    detector = EngineDetector()
    detector.ingest(raw, 100.0)
    detector.expire(100.0 + detector.limits.count_wait - 1)
    assert detector.delegations == {}
    detector.expire(100.0 + detector.limits.count_wait)
    assert detector.delegations == {("planner", "search"): 1}


def test_an_agent_run_from_another_process_arriving_after_its_tool_takes_the_tools_edge() -> None:
    trace = Trace()
    tool = trace.tool("ask_budget", trace.agent("planner"))
    client = trace.span("POST", tool, kind=CLIENT)
    server = trace.span("POST /ask", client, kind=SERVER)
    budget = trace.agent("budget", server)
    detector = EngineDetector()
    first, later = trace.spans[:3], trace.spans[3:]
    for batch, now in ((first, 0.0), (later, 4.0)):
        raw = encode(*batch)
        detector.ingest(raw, now)
    detector.expire(60.0)
    assert detector.delegations == {("planner", "budget"): 1}
    assert (detector.pending_spans, budget.name) == (0, "invoke_agent budget")  # settled


def test_an_agent_that_calls_a_tool_named_after_itself_reentered_itself() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    tool = trace.tool("planner", planner)
    trace.agent("planner", tool)  # the run of that tool: one hop with it, no second series
    detector = detect(trace.spans)
    assert detector.cycles == {("direct", "planner>planner"): 1}
    assert detector.delegations == {("planner", "planner"): 1}


def test_the_same_instrumentation_recording_an_agent_inside_itself_is_a_direct_cycle() -> None:
    trace = Trace()
    trace.agent("wiki_agent", trace.agent("wiki_agent", scope="pydantic-ai"), scope="pydantic-ai")
    assert detect(trace.spans).cycles == {("direct", "wiki_agent>wiki_agent"): 1}


def test_two_instrumentations_recording_one_call_are_one_hop() -> None:
    trace = Trace()
    runtime = trace.agent("planner", scope="pydantic-ai")
    trace.tool("search", trace.agent("planner", runtime, scope="openinference.instrumentation.x"))
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "search"): 1}


def test_a_wrapper_span_of_the_same_instrumentation_is_the_same_call() -> None:
    # Traceloop: invoke_agent planner around planner.workflow (read by its attributes).
    trace = Trace()
    outer = trace.agent("planner", scope=TRACELOOP_LANGCHAIN)
    workflow = trace.span(
        "planner.workflow",
        outer,
        scope=TRACELOOP_LANGCHAIN,
        attributes={
            "traceloop.span.kind": "workflow",
            "traceloop.entity.name": "planner",
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "planner",
        },
    )
    trace.tool("search", workflow, scope=TRACELOOP_LANGCHAIN)
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "search"): 1}


def test_client_and_server_sides_of_a_remote_call_are_one_hop() -> None:
    trace = Trace()
    client = trace.agent("budget", trace.agent("planner"), kind=CLIENT)
    trace.agent("budget", client, kind=SERVER)
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 1}


def test_two_agent_spans_of_one_tool_call_count_one_edge() -> None:
    # Traceloop records a LangGraph agent run below a tool twice: invoke_agent X and a task X.
    trace = Trace()
    tool = trace.tool(
        "ask_budget", trace.agent("planner", scope=TRACELOOP_LANGCHAIN), scope=TRACELOOP_LANGCHAIN
    )
    trace.agent("budget", tool, scope=TRACELOOP_LANGCHAIN)
    trace.span(
        "execute_task budget",
        tool,
        scope=TRACELOOP_LANGCHAIN,
        attributes={"traceloop.span.kind": "task", "traceloop.entity.name": "budget"},
    )
    detector = detect(trace.spans)
    assert detector.delegations == {("planner", "budget"): 1}


def test_a_task_is_a_call_only_first_below_a_tool() -> None:
    trace = Trace()
    planner = trace.agent("planner", scope=TRACELOOP_LANGCHAIN)
    task = {"traceloop.span.kind": "task", "traceloop.entity.name": "model"}
    node = trace.span("execute_task model", planner, scope=TRACELOOP_LANGCHAIN, attributes=task)
    trace.span("execute_task model", node, scope=TRACELOOP_LANGCHAIN, attributes=task)
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {}


def test_a_langgraph_graph_run_is_the_agent_in_openinference() -> None:
    trace = Trace()
    planner = oi(trace, "planner", "CHAIN")
    node = oi(trace, "model", "CHAIN", planner)
    oi(trace, "call_model", "CHAIN", node)
    oi(trace, "agent", "AGENT", planner)  # LangChain's AGENT kind is a guess from the run name
    tools = oi(trace, "tools", "CHAIN", planner)
    ask = oi(trace, "ask_budget", "TOOL", tools, **{"tool.name": "ask_budget"})
    budget = oi(trace, "budget", "CHAIN", ask)
    ask_again = oi(
        trace, "ask_planner", "TOOL", oi(trace, "tools", "CHAIN", budget), **{"tool.name": "ask_planner"}
    )
    oi(trace, "planner", "CHAIN", ask_again)
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_a_conditional_call_that_waits_for_its_parent_is_decided_when_it_settles() -> None:
    trace = Trace()
    planner = oi(trace, "planner", "CHAIN")
    ask = oi(trace, "ask_budget", "TOOL", planner, **{"tool.name": "ask_budget"})
    budget = oi(trace, "budget", "CHAIN", ask)
    inner = oi(trace, "model", "CHAIN", budget)
    # Children first, one request each: every span waits until the root arrives.
    detector = detect(*([span] for span in reversed(trace.spans)))
    assert detector.delegations == {("planner", "budget"): 1}
    assert (detector.pending_spans, detector.stored_spans) == (0, 4)  # the model run settled too
    assert inner.name == "model"


def test_invoke_workflow_spans_are_calls() -> None:
    trace = Trace()
    crew = trace.span("invoke_workflow trip", attributes={"gen_ai.operation.name": "invoke_workflow"})
    planner = trace.agent("planner", crew)
    trace.span(
        "kickoff",
        planner,
        attributes={"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": "trip"},
    )
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "trip>planner>trip"): 1}


def test_a_trace_root_that_names_its_caller_continues_the_callers_path() -> None:
    # A remote agent's server span in a trace of its own (the caller's context was dropped) that
    # says who called it: gen_ai.caller.agent.name.
    planner_side, budget_side = Trace(), Trace()
    budget_side.agent("budget", kind=SERVER, attributes={"gen_ai.caller.agent.name": "planner"})
    planner_side.agent("planner", kind=SERVER, attributes={"gen_ai.caller.agent.name": "planner"})
    detector = detect(budget_side.spans, planner_side.spans)
    assert detector.delegations == {("planner", "budget"): 1, ("planner", "planner"): 1}
    assert detector.cycles == {("cross_trace", "planner>planner"): 1}


def test_names_and_labels_are_cut_to_their_bounds_and_counted() -> None:
    from otel_guard_processor.bounds import CUT, MAX_LABEL_CHARS, MAX_NAME_CHARS

    huge = "p" * 100_000
    trace = Trace()
    agent = trace.agent(huge)
    names = [f"{index:03d}" + "x" * 300 for index in range(5)]
    parent = agent
    for name in names:
        parent = trace.agent(name, parent)
    trace.agent(huge, parent)  # back to the first: a label of six long names
    detector = detect(trace.spans)
    ((kind, label),) = detector.cycles
    assert kind == "cross_function"
    assert len(label) == MAX_LABEL_CHARS
    assert label.endswith(CUT)
    assert label.startswith("p" * (MAX_NAME_CHARS - 1) + CUT + ">")
    assert all(
        len(caller) <= MAX_NAME_CHARS and len(callee) <= MAX_NAME_CHARS
        for caller, callee in detector.delegations
    )
    assert detector.truncated == {"name": 7, "label": 1}


def test_long_names_from_attributes_and_chains_are_cut_too() -> None:
    from otel_guard_processor.bounds import MAX_NAME_CHARS

    long = "a" * 5000
    trace = Trace()
    run = trace.span(
        "agent run", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": long}
    )
    trace.span(
        "tool run", run, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "b" * 3000}
    )
    detector = detect(trace.spans)
    ((caller, callee),) = detector.delegations
    assert len(caller) == len(callee) == MAX_NAME_CHARS


def test_a_conditional_call_below_a_guard_chain_is_a_link() -> None:
    # A trace that continues a guard chain (its root carries planner -> budget): LangGraph's graph
    # nodes below budget's run are no calls.
    from processor_spans import guard_attributes

    trace = Trace()
    budget = trace.agent("budget", attributes=guard_attributes(["planner", "budget"]))
    node = oi(trace, "model", "CHAIN", budget)
    oi(trace, "call_model", "CHAIN", node)
    detector = detect(trace.spans)
    assert detector.delegations == {("planner", "budget"): 1}
    assert detector.cycles == {}
