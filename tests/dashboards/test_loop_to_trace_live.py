"""From a loop on the dashboard to its trace, against the live stack (conftest.py): the real
processor fed the guarded program's loops, scraped by a real Prometheus with exemplar storage on.

- The cycle panel's query, sent to ``/api/v1/query_exemplars`` as Grafana sends it, returns each
  loop's exemplar with the trace id of the trace the loop ran in (the guarded program prints it).
- Each loop's firing alert links (``dashboard_url``) to the dashboard with the Cycle variable set to
  its loop: the cycle panel's query, so substituted, returns that loop's exemplar and no other.
- The decision counter's refusal and would-refuse series carry the span of their decision as an
  exemplar: the trace the loop ran in.
- The processor wrote one log line for each loop, naming the same trace.
- The node graph's two queries, shaped as Grafana shapes an instant table query and then by the
  panel's own transformation, give the frames Grafana's node graph reads: nodes with ``id`` and
  ``title``, edges with ``id``, ``source`` and ``target`` between those nodes, the loops' edges red.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from dashboard_files import load_dashboard, panel, substitute
from live_stack import TEMPLATE_VALUES, Stack, eventually, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOOPS = {"planner>budget>planner": "cross_function", "summarize>summarize": "direct"}
ON_A_LOOP = "#e02f44"
OFF_A_LOOP = "#8e8e8e"
GRAPH = "Delegation graph (edges on a counted loop in red)"


def _loop_traces(stack: Stack) -> dict[str, str]:
    """Cycle label -> the trace id (hex) the guarded program ran that loop in."""
    traces = {}
    for line in stack.app.output().splitlines():
        if line.startswith("loop "):
            _, cycle, trace_id = line.split()
            traces[cycle] = trace_id
    assert set(traces) == set(LOOPS), stack.app.tail()
    return traces


def _exemplars(stack: Stack, expr: str) -> dict[str, list[dict[str, str]]]:
    """Cycle label -> the exemplars' labels Prometheus holds for the series ``expr`` selects."""
    now = time.time()
    answer = stack.prometheus.api("query_exemplars", query=expr, start=str(now - 600), end=str(now + 60))
    assert answer["status"] == "success", answer
    found: dict[str, list[dict[str, str]]] = {}
    for series in answer["data"]:
        found.setdefault(series["seriesLabels"].get("cycle", ""), []).extend(
            exemplar["labels"] for exemplar in series["exemplars"]
        )
    return found


def test_each_loop_is_an_exemplar_on_the_cycle_panel_with_its_trace_id(stack: Stack) -> None:
    traces = _loop_traces(stack)
    cycles = panel(load_dashboard(), "Cycles by kind and cycle")
    (target,) = cycles["targets"]
    assert target["exemplar"] is True  # Grafana asks for the panel's exemplars
    expr = substitute(target["expr"], TEMPLATE_VALUES)

    def check() -> None:
        found = _exemplars(stack, expr)
        for cycle, trace_id in traces.items():
            assert [e["trace_id"] for e in found.get(cycle, [])] == [trace_id], found
            (exemplar,) = found[cycle]
            assert len(exemplar["span_id"]) == 16
            # The guard's spans name their chain's root: it finds a cross-trace loop's other traces.
            assert set(exemplar) == {"trace_id", "span_id", "chain_root"}
            assert re.fullmatch("[0-9a-f]{32}", exemplar["chain_root"])

    eventually(check, timeout=30)


def _cycle_alert_links(stack: Stack) -> dict[str, str] | None:
    """Cycle label -> dashboard_url of its firing OtelGuardCycleDetected, once every loop's fires."""
    links = {
        alert["labels"]["cycle"]: alert["annotations"]["dashboard_url"]
        for alert in stack.prometheus.alerts()
        if alert["labels"]["alertname"] == "OtelGuardCycleDetected" and alert["state"] == "firing"
    }
    return links if set(links) == set(LOOPS) else None


def test_each_cycle_alert_links_to_the_exemplar_of_its_loop(stack: Stack) -> None:
    """The link Prometheus sends with the alert opens the dashboard on that loop alone: its cycle
    panel then holds one exemplar, whose trace id is the trace the loop ran in."""
    traces = _loop_traces(stack)
    dashboard = load_dashboard()
    (target,) = panel(dashboard, "Cycles by kind and cycle")["targets"]
    links = wait_for("every loop's cycle alert", lambda: _cycle_alert_links(stack), timeout=60)
    for cycle, link in links.items():
        url = urlsplit(link)
        assert url.path == f"/d/{dashboard['uid']}", link
        (chosen,) = parse_qs(url.query)["var-cycle"]
        assert chosen == cycle
        # Grafana puts a variable's value into a regex matcher with its metacharacters escaped.
        expr = substitute(target["expr"], {**TEMPLATE_VALUES, "cycle": re.escape(chosen)})

        def check(cycle: str = cycle, expr: str = expr) -> None:
            found = _exemplars(stack, expr)
            assert {c: [e["trace_id"] for e in exemplars] for c, exemplars in found.items()} == {
                cycle: [traces[cycle]]
            }, found

        eventually(check, timeout=30)


def test_each_refusal_is_an_exemplar_on_the_decision_counter_with_its_trace_id(stack: Stack) -> None:
    """The summarize loop was refused (enforce), planner>budget>planner would have been (observe):
    each decision series holds one span, in the loop's trace."""
    traces = _loop_traces(stack)
    expected = {
        ("refuse", "cycle", "summarize"): traces["summarize>summarize"],
        ("would_refuse", "cycle", "planner"): traces["planner>budget>planner"],
    }

    def check() -> None:
        now = time.time()
        answer = stack.prometheus.api(
            "query_exemplars",
            query='otel_guard_span_decisions_total{reason="cycle"}',
            start=str(now - 600),
            end=str(now + 60),
        )
        assert answer["status"] == "success", answer
        found = {
            (labels["decision"], labels["reason"], labels["agent"]): [
                exemplar["labels"] for exemplar in series["exemplars"]
            ]
            for series in answer["data"]
            for labels in [series["seriesLabels"]]
        }
        for decision, trace_id in expected.items():
            assert [e["trace_id"] for e in found.get(decision, [])] == [trace_id], found
            (exemplar,) = found[decision]
            assert len(exemplar["span_id"]) == 16

    eventually(check, timeout=30)


def test_each_loop_is_one_log_line_naming_its_trace(stack: Stack) -> None:
    traces = _loop_traces(stack)
    lines = [line for line in stack.processor.output().splitlines() if "loop counted" in line]
    assert len(lines) == len(LOOPS), lines
    for cycle, trace_id in traces.items():
        (line,) = [line for line in lines if f'cycle="{cycle}"' in line]
        assert f"kind={LOOPS[cycle]} " in line
        assert f"trace_id={trace_id} " in line
        assert " WARNING " in line


def _frames(stack: Stack, graph: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each target's frame as Grafana builds it for an instant ``table`` query (transformDFToTable:
    Time, the labels, then ``Value`` or, with more than one query, ``Value #<refId>``; a label a
    series lacks is ''), then through the panel's ``organize`` transformation. Rows of fields."""
    targets = graph["targets"]
    (organize,) = [t["options"] for t in graph["transformations"] if t["id"] == "organize"]
    excluded = {name for name, out in organize["excludeByName"].items() if out}
    renamed = organize["renameByName"]
    frames = {}
    for target in targets:
        assert target["format"] == "table"
        assert target["instant"] is True
        value = f"Value #{target['refId']}" if len(targets) > 1 else "Value"
        result = stack.prometheus.vector(substitute(target["expr"], TEMPLATE_VALUES))
        labels = sorted({name for metric, _ in result for name in metric})
        rows = [
            {"Time": 0, **{name: metric.get(name, "") for name in labels}, value: number}
            for metric, number in result
        ]
        frames[target["refId"]] = [
            {renamed.get(name, name): field for name, field in row.items() if name not in excluded}
            for row in rows
        ]
    return frames


def test_the_node_graph_queries_give_the_fields_the_panel_reads(stack: Stack) -> None:
    graph = panel(load_dashboard(), GRAPH)
    assert graph["type"] == "nodeGraph"

    def check() -> None:
        frames = _frames(stack, graph)
        # Grafana's node graph takes a frame with a `source` field as the edges, the other as nodes.
        (edges,) = [rows for rows in frames.values() if rows and "source" in rows[0]]
        (nodes,) = [rows for rows in frames.values() if rows and "source" not in rows[0]]
        node_ids = set()
        for node in nodes:
            assert {"id", "title", "mainstat"} <= set(node), node
            assert node["title"] == node["id"]
            node_ids.add(node["id"])
        assert len(node_ids) == len(nodes)
        colors = {}
        for edge in edges:
            assert {"id", "source", "target", "mainstat", "color"} <= set(edge), edge
            assert edge["id"] == f"{edge['source']}>{edge['target']}"
            # An edge between nodes the nodes frame lacks breaks the panel (it looks them up).
            assert {edge["source"], edge["target"]} <= node_ids, (edge, node_ids)
            colors[(edge["source"], edge["target"])] = edge["color"]
        assert len(colors) == len(edges)
        # The loops' edges are marked; the calls around them are not.
        for pair in [("planner", "budget"), ("budget", "planner"), ("summarize", "summarize")]:
            assert colors[pair] == ON_A_LOOP, colors
        for pair in [("planner", "search"), ("step1", "step2"), ("dispatcher", "researcher")]:
            assert colors[pair] == OFF_A_LOOP, colors
        by_edge = {(e["source"], e["target"]): e for e in edges}
        assert by_edge[("planner", "budget")]["mainstat"] == 1
        assert by_edge[("planner", "budget")]["detail__on_a_counted_cycle"] == "yes"
        assert by_edge[("planner", "search")]["detail__on_a_counted_cycle"] == "no"
        # budget received one call, from planner; the dispatcher, which started its tree, none.
        received = {node["id"]: node["mainstat"] for node in nodes}
        assert received["budget"] == 1
        assert received["dispatcher"] == 0

    eventually(check, timeout=30)
