"""otel-guard beside the instrumentation a team already runs, in one process: what the processor counts.

Each case runs the planner ⇄ budget programs of ``record_app.py`` with otel-guard's instrumentor for
the runtime *and* a real third-party instrumentation, exporting to a processor on 127.0.0.1. The
processor must count what it counts with the guard alone: one series ``planner>budget>planner`` when
the loop is tried (refused in enforce mode, let through in observe mode), none in a healthy run, and
never a false ``X>X`` from two spans of one call, and one delegation edge per call -- also where the
third party parents its spans by its runtime's run tree, so that they stand beside the guard's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_spans import read_spans
from dialect_runs import record
from processor_helpers import ProcessorFactory, grpc_address, scrape, series
from test_third_party_traces import INSTRUMENTED_RUNTIMES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GUARD = {"OTEL_GUARD_CYCLE_RULE": "agent"}
GUARD_SCOPE = "otel_guard"
UNUSED_ENDPOINT = "127.0.0.1:9"  # the recorder writes JSON lines (--jsonl) and exports nothing
LOOP = {("planner>budget>planner", "cross_function"): 1}
# (callee, caller): the refused second planner hop is an attempt the processor counts.
ENFORCE_EDGES = {("budget", "planner"): 1, ("planner", "budget"): 1}
OBSERVE_EDGES = {("budget", "planner"): 3, ("planner", "budget"): 2}


async def run(start: ProcessorFactory, runtime: str, instrumentation: str, scenario: str, mode: str) -> dict:
    processor = await start()
    env = {**GUARD, "OTEL_GUARD_MODE": mode}
    result = await record(grpc_address(processor), runtime, instrumentation, scenario, "--guard", env=env)
    samples = await scrape(processor)
    return {"result": result, "samples": samples}


@pytest.mark.parametrize(("runtime", "instrumentation"), INSTRUMENTED_RUNTIMES)
async def test_enforce_the_first_bounce_is_refused_and_counted_once(
    start_processor: ProcessorFactory, runtime: str, instrumentation: str
) -> None:
    seen = await run(start_processor, runtime, instrumentation, "loop", "enforce")
    assert seen["result"]["tool_calls"] == 2  # planner -> budget -> planner (refused)
    samples = seen["samples"]
    assert series(samples, "otel_guard_cycles_total") == LOOP
    decisions = series(samples, "otel_guard_span_decisions_total")
    assert decisions[("planner", "refuse", "cycle")] == 1
    assert series(samples, "otel_guard_delegations_total") == ENFORCE_EDGES


@pytest.mark.parametrize(("runtime", "instrumentation"), INSTRUMENTED_RUNTIMES)
async def test_observe_the_loop_runs_and_is_one_series(
    start_processor: ProcessorFactory, runtime: str, instrumentation: str
) -> None:
    seen = await run(start_processor, runtime, instrumentation, "loop", "observe")
    assert seen["result"]["tool_calls"] == 5
    samples = seen["samples"]
    assert series(samples, "otel_guard_cycles_total") == LOOP
    decisions = series(samples, "otel_guard_span_decisions_total")
    assert decisions[("planner", "would_refuse", "cycle")] >= 1
    assert series(samples, "otel_guard_delegations_total") == OBSERVE_EDGES


@pytest.mark.parametrize(("runtime", "instrumentation"), INSTRUMENTED_RUNTIMES)
async def test_a_healthy_run_counts_no_cycle_beside_the_guard(
    start_processor: ProcessorFactory, runtime: str, instrumentation: str
) -> None:
    seen = await run(start_processor, runtime, instrumentation, "control", "enforce")
    assert seen["result"]["tool_calls"] == 1
    samples = seen["samples"]
    assert series(samples, "otel_guard_cycles_total") == {}
    assert ("planner", "refuse", "cycle") not in series(samples, "otel_guard_span_decisions_total")
    assert series(samples, "otel_guard_delegations_total") == {("budget", "planner"): 1}


def subject(name: str) -> str:
    """What a span is a call of: ``ask_budget`` of ``execute_tool ask_budget``, ``planner`` of
    ``planner.workflow`` (Traceloop), the name itself for OpenInference's ``budget``."""
    return name.rsplit(" ", 1)[-1].removesuffix(".workflow")


@pytest.mark.parametrize(("runtime", "instrumentation"), INSTRUMENTED_RUNTIMES)
async def test_the_guards_spans_stand_in_the_third_partys_tree(
    tmp_path: Path, runtime: str, instrumentation: str
) -> None:
    """One trace, one tree: each guard span is the parent of the third party's spans of its call,
    or stands under the third party's span of it (or under a guard span that does, as a refused
    agent hop inside a tool call); never a leaf beside the third party's span of the same call."""
    spans_file = tmp_path / "spans.jsonl"
    env = {**GUARD, "OTEL_GUARD_MODE": "enforce"}
    await record(
        UNUSED_ENDPOINT, runtime, instrumentation, "loop", "--guard", "--jsonl", str(spans_file), env=env
    )
    spans = read_spans(spans_file)
    assert len({span["trace_id"] for span in spans}) == 1
    by_id = {span["span_id"]: span for span in spans}
    children: dict[str | None, list[dict]] = {}
    for span in spans:
        children.setdefault(span["parent_id"], []).append(span)
    guards = [span for span in spans if span["scope"] == GUARD_SCOPE]
    assert [span["name"] for span in guards if span["attributes"]["otel_guard.decision"] == "refuse"] == [
        "invoke_agent planner"
    ]

    def in_their_tree(span: dict) -> bool:
        parent = by_id.get(span["parent_id"])
        if parent is not None and parent["scope"] != GUARD_SCOPE:
            return True  # under their span
        if any(child["scope"] != GUARD_SCOPE for child in children.get(span["span_id"], [])):
            return True  # their spans of the call under it
        return parent is not None and in_their_tree(parent)

    for span in guards:
        assert in_their_tree(span), f"{span['name']} stands in a subtree of the guard's own"
        if children.get(span["span_id"]):
            continue
        siblings = [s for s in children[span["parent_id"]] if s["scope"] != GUARD_SCOPE]
        beside = [s["name"] for s in siblings if subject(s["name"]) == subject(span["name"])]
        assert not beside, f"{span['name']} is a leaf beside their span of the same call: {beside}"
