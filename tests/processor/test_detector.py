"""Cycle detection on real OTLP requests (protobuf built as the SDK builds it), by the engine.

The tests that look at the counts right after a request use ``AT_ONCE`` (``count_wait`` 0: a count
is made in the request that makes it due); ``detect`` sweeps once the wait is over.
"""

from __future__ import annotations

import random

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor.bounds import MAX_PATH_NAMES, DetectorLimits
from otel_guard_processor.engine import EngineDetector
from processor_spans import (
    CLIENT,
    CONSUMER,
    PRODUCER,
    SERVER,
    Trace,
    encode,
    guard_attributes,
)

AT_ONCE = DetectorLimits(count_wait=0.0)


def feed(detector: EngineDetector, *batches: list[Span], now: float = 0.0) -> EngineDetector:
    """Ingest each batch as one request, in order."""
    for batch in batches:
        raw = encode(*batch)
        detector.ingest(raw, now)
    return detector


def detect(*batches: list[Span]) -> EngineDetector:
    """A fresh detector fed ``batches`` at time 0, then swept once the tool edges' wait is over."""
    detector = feed(EngineDetector(), *batches)
    detector.expire(detector.limits.count_wait)
    return detector


def test_cross_function_cycle_is_found_with_its_path() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", planner)
    trace.agent("planner", budget)
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_direct_cycle_through_http_client_and_server_spans() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    trace.agent("planner", trace.http_hop(planner))
    assert detect(trace.spans).cycles == {("direct", "planner>planner"): 1}


def test_cross_function_cycle_through_http_spans_between_agents() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", trace.http_hop(planner))
    trace.agent("planner", trace.http_hop(budget))
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_an_agent_run_below_a_tool_call_is_that_call_in_the_agents_name() -> None:
    # planner -> tool ask_planner -> agent planner: planner re-entered itself; the tool's name
    # gives way to the agent's on the path, the label and the edges.
    trace = Trace()
    planner = trace.agent("planner")
    tool = trace.tool("ask_planner", planner)
    trace.agent("planner", trace.http_hop(tool))
    detector = detect(trace.spans)
    assert detector.cycles == {("direct", "planner>planner"): 1}
    assert detector.delegations == {("planner", "planner"): 1}


def test_tools_that_run_no_agent_keep_their_names_in_the_path() -> None:
    # MCP servers whose tools call each other: a loop of tools, labelled in tool names.
    trace = Trace()
    planner = trace.agent("planner")
    search = trace.tool("search", planner)
    fetch = trace.tool("fetch", search)
    trace.tool("search", fetch)
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "search>fetch>search"): 1}
    assert detector.delegations == {("planner", "search"): 1, ("search", "fetch"): 1, ("fetch", "search"): 1}


def test_name_comes_from_the_attribute_when_the_span_name_has_no_subject() -> None:
    trace = Trace()
    outer = trace.span("invoke_agent", attributes={"gen_ai.agent.name": "planner"})
    # A span named some other way still counts as a call by gen_ai.operation.name.
    inner = trace.span(
        "agent run",
        outer,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "budget"},
    )
    trace.span(
        "running tool",
        inner,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "planner"},
    )
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}


def test_non_call_spans_with_agent_attributes_are_not_names() -> None:
    # Some runtimes copy gen_ai.agent.name onto every span of a run (e.g. from baggage): a chat span
    # inside "invoke_agent planner" is not a second call to planner.
    trace = Trace()
    planner = trace.agent("planner")
    trace.span(
        "chat gpt-4o", planner, attributes={"gen_ai.operation.name": "chat", "gen_ai.agent.name": "planner"}
    )
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {}


def test_parallel_siblings_are_not_a_cycle() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    for _ in range(3):
        trace.agent("budget", planner)
        trace.tool("search", planner)
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 3, ("planner", "search"): 3}


def test_repeated_calls_from_one_parent_through_http_are_not_a_cycle() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    for _ in range(4):
        trace.agent("budget", trace.http_hop(planner))
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 4}


def test_same_cycle_counts_once_per_trace_and_again_in_another_trace() -> None:
    detector = EngineDetector(AT_ONCE)
    for _ in range(2):
        trace = Trace()
        planner = trace.agent("planner")
        for _ in range(3):  # the loop three times within one trace
            budget = trace.agent("budget", planner)
            trace.agent("planner", budget)
        feed(detector, trace.spans)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 2}
    assert detector.delegations == {("planner", "budget"): 6, ("budget", "planner"): 6}


def test_deep_recursion_is_one_cycle_not_one_per_depth() -> None:
    trace = Trace()
    span = trace.agent("summarize")
    for _ in range(6):
        span = trace.agent("summarize", span)
    assert detect(trace.spans).cycles == {("direct", "summarize>summarize"): 1}


def test_a_loop_that_bounces_many_times_is_one_series_labelled_from_the_first_return() -> None:
    trace = Trace()
    parent = trace.agent("a")
    for name in ("b", "a", "b", "a", "b"):
        parent = trace.agent(name, parent)
    detector = detect(trace.spans)
    # b>a>b, a>b>a again, ...: the same loop turning; only its first return counts.
    assert detector.cycles == {("cross_function", "a>b>a"): 1}


def test_distinct_loops_in_one_trace_each_count() -> None:
    trace = Trace()
    a = trace.agent("a")
    b = trace.agent("b", a)
    a2 = trace.agent("a", b)
    c = trace.agent("c", a2)
    trace.agent("a", c)
    detector = detect(trace.spans)
    assert detector.cycles == {("cross_function", "a>b>a"): 1, ("cross_function", "a>c>a"): 1}


def test_out_of_order_across_requests_children_first() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    hop = trace.http_hop(planner)
    budget = trace.agent("budget", hop)
    again = trace.agent("planner", trace.http_hop(budget))
    spans = list(trace.spans)
    detector = EngineDetector(AT_ONCE)
    # Leaves first, one span per request, the root last: nothing can settle until it arrives.
    for span in reversed(spans):
        feed(detector, [span])
        if span is not spans[0]:
            assert detector.cycles == {}
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.pending_spans == 0
    assert again.name == "invoke_agent planner"


@pytest.mark.parametrize("seed", range(20))
def test_any_arrival_order_and_batching_finds_the_same(seed: int) -> None:
    rng = random.Random(seed)
    trace = Trace()
    planner = trace.agent("planner")
    for _ in range(3):
        budget = trace.agent("budget", trace.http_hop(planner))
        trace.tool("lookup", budget)
        trace.agent("planner", trace.http_hop(budget))
    spans = list(trace.spans)
    rng.shuffle(spans)
    cuts = sorted(rng.sample(range(1, len(spans)), 4))
    batches = [spans[i:j] for i, j in zip([0, *cuts], [*cuts, len(spans)], strict=True)]
    detector = detect(*batches)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.delegations == {
        ("planner", "budget"): 3,
        ("budget", "lookup"): 3,
        ("budget", "planner"): 3,
    }
    assert detector.pending_spans == 0


def test_a_span_received_twice_does_not_count_again() -> None:
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    budget = trace.agent("budget", planner, attributes=guard_attributes(["planner", "budget"]))
    trace.agent(
        "planner",
        budget,
        attributes=guard_attributes(
            ["planner", "budget", "planner"], decision="would_refuse", reason="cycle"
        ),
    )
    detector = detect(trace.spans, trace.spans, list(reversed(trace.spans)))
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}
    assert detector.decisions == {
        ("allow", "", "planner"): 1,
        ("allow", "", "budget"): 1,
        ("would_refuse", "cycle", "planner"): 1,
    }
    assert detector.duplicates == 6


def test_a_waiting_span_received_twice_settles_once() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", planner)
    repeat = trace.agent("planner", budget)
    detector = detect([repeat, budget], [repeat, budget], [planner])
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_cross_trace_cycle_through_a_span_link() -> None:
    first = Trace()
    planner = first.agent("planner")
    send = first.span("publish tasks", planner, kind=PRODUCER)
    second = Trace()
    consume = second.span("process tasks", kind=CONSUMER, links=[send])
    budget = second.agent("budget", consume)
    second.agent("planner", budget)
    detector = detect(first.spans, second.spans)
    assert detector.cycles == {("cross_trace", "planner>budget>planner"): 1}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_cross_trace_link_arriving_before_the_linked_trace() -> None:
    first = Trace()
    planner = first.agent("planner")
    second = Trace()
    consume = second.span("process tasks", kind=CONSUMER, links=[planner])
    second.agent("planner", consume)
    detector = detect(second.spans, first.spans)
    assert detector.cycles == {("cross_trace", "planner>planner"): 1}
    assert detector.pending_spans == 0


def test_cross_trace_cycle_by_shared_chain_root() -> None:
    root = "cd" * 16
    first = Trace()
    planner = first.agent("planner", attributes=guard_attributes(["planner"], root))
    first.agent("budget", planner, attributes=guard_attributes(["planner", "budget"], root))
    # The chain went on in a new trace (e.g. a task queue carrying baggage but no traceparent).
    second = Trace()
    second.agent(
        "planner",
        attributes=guard_attributes(["planner", "budget", "planner"], root, "refuse", "cycle"),
    )
    detector = detect(first.spans, second.spans)
    assert detector.cycles == {("cross_trace", "planner>budget>planner"): 1}
    assert detector.decisions[("refuse", "cycle", "planner")] == 1
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "planner"): 1}


def test_chain_root_join_does_not_need_the_other_trace() -> None:
    second = Trace()
    second.agent("budget", attributes=guard_attributes(["planner", "budget"]))
    detector = detect(second.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 1}


def test_client_and_server_span_of_one_remote_call_are_not_a_cycle() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    client = trace.agent("budget", planner, kind=CLIENT)
    server = trace.agent("budget", trace.http_hop(client), kind=SERVER)
    trace.tool("lookup", server)
    detector = detect(trace.spans)
    assert detector.cycles == {}
    assert detector.delegations == {("planner", "budget"): 1, ("budget", "lookup"): 1}


def test_guard_spans_of_one_hop_on_both_sides_are_not_a_cycle() -> None:
    # The inline guard records a remote hop on the client and again on the server (receiving=True)
    # with the same chain depth.
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    client = trace.agent("budget", planner, attributes=guard_attributes(["planner", "budget"]))
    trace.agent("budget", trace.http_hop(client), attributes=guard_attributes(["planner", "budget"]))
    assert detect(trace.spans).cycles == {}


def test_runtime_span_inside_the_guard_span_of_the_same_call_is_not_a_cycle() -> None:
    trace = Trace()
    guarded = trace.agent("planner", attributes=guard_attributes(["planner"]))
    trace.agent("planner", guarded)  # the runtime's own invoke_agent span, no guard attributes
    assert detect(trace.spans).cycles == {}


def test_guard_recursion_with_growing_depth_is_a_direct_cycle() -> None:
    trace = Trace()
    outer = trace.agent("summarize", attributes=guard_attributes(["summarize"]))
    trace.agent("summarize", outer, attributes=guard_attributes(["summarize", "summarize"]))
    assert detect(trace.spans).cycles == {("direct", "summarize>summarize"): 1}


def test_remote_self_call_is_found_once_not_hidden_by_the_server_span() -> None:
    trace = Trace()
    outer = trace.agent("planner")
    client = trace.agent("planner", outer, kind=CLIENT)
    server = trace.agent("planner", trace.http_hop(client), kind=SERVER)
    trace.agent("planner", server)  # and the server calls itself again, in process
    detector = detect(trace.spans)
    assert detector.cycles == {("direct", "planner>planner"): 1}
    assert detector.delegations == {("planner", "planner"): 2}


def test_decisions_are_read_from_guard_attributes() -> None:
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    trace.tool(
        "search",
        planner,
        attributes=guard_attributes(["planner", "search"], decision="refuse", reason="depth"),
    )
    detector = detect(trace.spans)
    assert detector.decisions == {("allow", "", "planner"): 1, ("refuse", "depth", "search"): 1}


def test_spans_without_names_or_guard_attributes_count_nothing() -> None:
    trace = Trace()
    root = trace.span("GET /")
    trace.span("SELECT users", trace.http_hop(root))
    detector = detect(trace.spans)
    assert (detector.cycles, detector.delegations, detector.decisions) == ({}, {}, {})
    assert detector.stored_spans == 4


def test_max_traces_evicts_the_least_recently_active() -> None:
    detector = EngineDetector(DetectorLimits(max_traces=3))
    traces = [Trace() for _ in range(5)]
    for trace in traces:
        feed(detector, [trace.agent("planner")])
    assert detector.active_traces == 3
    assert detector.evictions["capacity"] == 2
    assert detector.stored_spans == 3


def test_ttl_evicts_idle_traces_and_settles_their_orphans() -> None:
    detector = EngineDetector(DetectorLimits(trace_ttl=10.0))
    trace = Trace()
    missing_parent = trace.agent("planner")  # never sent
    budget = trace.agent("budget", missing_parent)
    trace.agent("budget", budget)
    feed(detector, trace.spans[1:], now=100.0)
    assert detector.cycles == {}
    assert detector.pending_spans == 2
    assert detector.expire(105.0) == 0
    assert detector.expire(111.0) == 1
    # The orphan subtree was settled as a root before the trace went: its own cycle is found.
    assert detector.cycles == {("direct", "budget>budget"): 1}
    assert (detector.active_traces, detector.stored_spans, detector.pending_spans) == (0, 0, 0)
    assert detector.evictions["ttl"] == 1


def test_activity_keeps_a_trace_alive() -> None:
    detector = EngineDetector(DetectorLimits(trace_ttl=10.0, count_wait=0.0))
    trace = Trace()
    planner = trace.agent("planner")
    feed(detector, [planner], now=0.0)
    feed(detector, [trace.agent("budget", planner)], now=8.0)
    assert detector.expire(15.0) == 0
    feed(detector, [trace.agent("planner", trace.spans[-1])], now=15.0)
    assert detector.cycles == {("cross_function", "planner>budget>planner"): 1}


def test_max_spans_per_trace_drops_and_counts() -> None:
    detector = EngineDetector(DetectorLimits(max_spans_per_trace=4))
    trace = Trace()
    parent = trace.agent("planner")
    for _ in range(5):
        parent = trace.span("step", parent)
    feed(detector, trace.spans[:4])
    feed(detector, trace.spans[4:])  # the trace is full when this request starts on it
    assert detector.dropped["trace_full"] == 2
    assert detector.stored_spans == 4


def test_max_spans_evicts_whole_traces() -> None:
    detector = EngineDetector(DetectorLimits(max_spans=10))
    for _ in range(4):
        trace = Trace()
        parent = trace.agent("planner")
        for _ in range(3):
            parent = trace.span("step", parent)
        feed(detector, trace.spans)
    assert detector.stored_spans <= 10
    assert detector.evictions["capacity"] == 2


def test_parent_id_loop_does_not_hang_eviction() -> None:
    trace = Trace()
    a = trace.agent("a")
    b = trace.agent("b", a)
    a.parent_span_id = b.span_id  # a malformed trace: a and b are each other's parent
    detector = EngineDetector(DetectorLimits(trace_ttl=1.0))
    feed(detector, [a, b], now=0.0)
    assert detector.pending_spans == 2
    detector.expire(5.0)
    assert (detector.active_traces, detector.pending_spans, detector.stored_spans) == (0, 0, 0)


def test_paths_keep_a_bounded_number_of_names() -> None:
    trace = Trace()
    span = trace.agent("agent-0")
    for index in range(1, MAX_PATH_NAMES + 20):
        span = trace.agent(f"agent-{index}", span)
    trace.agent("agent-0", span)  # beyond the kept names: not seen as a cycle
    last = f"agent-{MAX_PATH_NAMES + 19}"
    trace.agent(last, span)  # within them: a direct cycle
    detector = detect(trace.spans)
    assert list(detector.cycles) == [("direct", f"{last}>{last}")]


def test_max_traces_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="max_traces"):
        EngineDetector(DetectorLimits(max_traces=1))


def test_a_guard_span_whose_parent_never_comes_settles_on_its_chain() -> None:
    # As in a tier that receives only the guard's spans: the HTTP spans between hops go elsewhere.
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    hop = trace.http_hop(planner)
    budget = trace.agent("budget", hop, attributes=guard_attributes(["planner", "budget"]))
    repeat = trace.agent(
        "planner", trace.http_hop(budget), attributes=guard_attributes(["planner", "budget", "planner"])
    )
    detector = EngineDetector(DetectorLimits(trace_ttl=5.0))
    feed(detector, [planner, budget, repeat], now=0.0)
    assert detector.cycles == {}  # budget and the repeat wait for their HTTP parents
    detector.expire(10.0)
    assert detector.cycles == {("cross_trace", "planner>budget>planner"): 1}


def test_decisions_counted_in_bulk_equal_those_read_span_by_span() -> None:
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    for _ in range(3):
        trace.tool("search", planner, attributes=guard_attributes(["planner", "search"]))
    all_allow = detect(trace.spans)
    assert all_allow.decisions == {("allow", "", "planner"): 1, ("allow", "", "search"): 3}
    # The same with one refusal among them: read span by span, each counted as it says.
    trace.tool(
        "search",
        planner,
        attributes=guard_attributes(["planner", "search"], decision="refuse", reason="depth"),
    )
    mixed = detect(trace.spans)
    assert mixed.decisions == {
        ("allow", "", "planner"): 1,
        ("allow", "", "search"): 3,
        ("refuse", "depth", "search"): 1,
    }


def test_guard_span_without_decision_is_not_counted_as_allow() -> None:
    trace = Trace()
    planner = trace.agent("planner", attributes=guard_attributes(["planner"]))
    attributes = guard_attributes(["planner", "search"])
    del attributes["otel_guard.decision"]
    trace.tool("search", planner, attributes=attributes)
    assert detect(trace.spans).decisions == {("allow", "", "planner"): 1}


def test_calls_named_otherwise_are_found_by_operation_in_the_scopes_that_use_them() -> None:
    detector = EngineDetector(AT_ONCE)
    trace = Trace()
    run = trace.span(
        "agent run", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    )
    tool = trace.span(
        "running tool", run, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "b"}
    )
    trace.span(
        "agent run", tool, attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    )
    feed(detector, trace.spans, now=0.0)
    # The tool b ran the agent a: a re-entered itself, in agent names.
    assert detector.cycles == {("direct", "a>a"): 1}
    # Later requests from the same scope are read the same way.
    again = Trace()
    run = again.span(
        "agent run", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    )
    again.span(
        "agent run", run, attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}
    )
    feed(detector, again.spans, now=1.0)
    assert detector.cycles[("direct", "a>a")] == 2


def test_a_call_span_named_with_an_empty_subject_takes_the_attribute() -> None:
    trace = Trace()
    planner = trace.agent("planner")
    trace.span("invoke_agent ", planner, attributes={"gen_ai.agent.name": "planner"})
    assert detect(trace.spans).cycles == {("direct", "planner>planner"): 1}


def test_label_sets_past_the_limit_are_counted_as_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_guard_processor import engine

    monkeypatch.setattr(engine, "MAX_SERIES", 3)
    trace = Trace()
    root = trace.agent("root")
    for index in range(5):
        agent = trace.agent(f"agent-{index}", root)
        trace.agent(f"agent-{index}", trace.agent("helper", agent))
    detector = detect(trace.spans)
    assert len(detector.delegations) == 4  # three label sets and the overflow
    assert sum(detector.delegations.values()) == 15  # nothing lost
    assert detector.delegations[("_overflow", "_overflow")] == 12
    assert len(detector.cycles) == 4
    assert detector.cycles[("cross_function", "_overflow")] == 2


def test_evicting_a_trace_of_many_orphans_is_linear_in_them() -> None:
    """Spans waiting for distinct parents that never come, settled at eviction: 16 times the orphans
    must cost far less than 256 times as long (it was quadratic once: 16,000 took 24 s)."""
    import time

    def eviction_seconds(orphans: int) -> float:
        # One trace of them all: its span limit above the largest count (it is checked every 256
        # spans of a request).
        detector = EngineDetector(DetectorLimits(trace_ttl=1.0, max_spans_per_trace=40_000))
        trace = Trace()
        spans = [trace.agent(f"agent-{index}") for index in range(orphans)]
        for index, span in enumerate(spans, start=1):
            span.parent_span_id = index.to_bytes(8, "big")  # a parent that never arrives
        feed(detector, spans)
        assert detector.pending_spans == orphans
        started = time.perf_counter()
        detector.expire(10.0)
        elapsed = time.perf_counter() - started
        assert detector.pending_spans == 0
        assert detector.evictions["ttl"] == 1
        return elapsed

    # Quadratic would be 256 times; 8 times the orphans took the engine 10 to 25 times as long (its
    # maps outgrow the caches), and a loaded machine has doubled a ratio of times that short: 16
    # times leaves linear and quadratic far apart.
    small = min(eviction_seconds(2_000) for _ in range(3))
    large = min(eviction_seconds(32_000) for _ in range(3))
    assert large / small < 128, (small, large)
