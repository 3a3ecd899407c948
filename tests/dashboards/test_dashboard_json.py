"""The Grafana dashboard's structure: a current schema, a data source variable, and panels that each
have a title, a description, a unit, the data source and queries that read metrics that exist."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest
from dashboard_files import (
    GRAFANA_BUILTINS,
    alert_queries,
    all_panels,
    content_panels,
    dashboard_queries,
    iter_label_values_queries,
    load_dashboard,
    metric_names,
    variables_in,
)
from metric_sources import guard_samples, processor_metric_names

DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def test_dashboard_has_the_schema_of_a_current_grafana(dashboard: dict[str, Any]) -> None:
    # 41 is Grafana 12's schema; later Grafanas migrate it forward on load.
    assert dashboard["schemaVersion"] == 41
    assert dashboard["uid"] == "otel-guard-recursion"
    assert dashboard["title"]
    assert dashboard["description"]
    # A provisioned dashboard has no database id; Grafana assigns one.
    assert dashboard["id"] is None
    assert dashboard["time"] == {"from": "now-6h", "to": "now"}


def test_data_source_is_a_template_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    datasource = variables["datasource"]
    assert datasource["type"] == "datasource"
    assert datasource["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE_REF, variable["name"]


def test_every_panel_has_a_title_description_unit_datasource_and_target(dashboard: dict[str, Any]) -> None:
    panels = content_panels(dashboard)
    assert len(panels) >= 20
    for panel in panels:
        title = panel.get("title")
        assert title, f"panel {panel['id']} has no title"
        assert panel.get("description"), f"panel {title!r} has no description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"panel {title!r} has no unit"
        assert panel["datasource"] == DATASOURCE_REF, f"panel {title!r} does not use $datasource"
        assert panel["targets"], f"panel {title!r} has no target"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), f"panel {title!r} repeats a refId"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE_REF, f"panel {title!r} target {target['refId']}"
            assert target["expr"].strip(), f"panel {title!r} target {target['refId']} has no expr"


def test_rows_hold_no_queries(dashboard: dict[str, Any]) -> None:
    rows = [panel for panel in all_panels(dashboard) if panel["type"] == "row"]
    assert rows
    for row in rows:
        assert row["title"]
        assert "targets" not in row
        # An open row keeps its panels at the top level, after it.
        assert row["collapsed"] is False
        assert row["panels"] == []


def test_panel_ids_are_unique_and_the_layout_fits_the_grid(dashboard: dict[str, Any]) -> None:
    panels = all_panels(dashboard)
    ids = [panel["id"] for panel in panels]
    assert len(set(ids)) == len(ids)
    boxes = []
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0
        assert pos["w"] > 0
        assert pos["h"] > 0
        assert pos["x"] + pos["w"] <= GRID_WIDTH, f"panel {panel['title']!r} runs off the grid"
        boxes.append((panel["title"], pos["x"], pos["y"], pos["x"] + pos["w"], pos["y"] + pos["h"]))
    for (a, ax0, ay0, ax1, ay1), (b, bx0, by0, bx1, by1) in combinations(boxes, 2):
        overlap = ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1
        assert not overlap, f"panels {a!r} and {b!r} overlap"


def test_expressions_use_only_declared_variables(dashboard: dict[str, Any]) -> None:
    declared = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_BUILTINS
    for query in dashboard_queries(dashboard):
        undeclared = variables_in(query.expr) - declared
        assert not undeclared, f"{query.where} uses undeclared variables {undeclared}"


def test_alert_expressions_use_no_template_variables() -> None:
    for query in alert_queries():
        assert not variables_in(query.expr), f"{query.where}: alert rules have no template variables"


def test_dashboard_and_alerts_read_only_metrics_that_are_served(dashboard: dict[str, Any]) -> None:
    """Every metric name is one that the guard (through the OpenTelemetry Prometheus exporter) or the
    processor actually serves; a typo or a renamed metric fails here."""
    served = set(guard_samples()) | processor_metric_names() | {"up"}
    queries = dashboard_queries(dashboard) + alert_queries()
    used: set[str] = set()
    for query in queries:
        names = metric_names(query.expr)
        assert names or query.expr.startswith("vector("), f"{query.where} reads no metric"
        assert names <= served, f"{query.where} reads {names - served}, which nothing serves"
        used |= names
    for name, metric, _label in iter_label_values_queries(dashboard):
        assert metric in served, f"variable {name} reads {metric}, which nothing serves"
    # The guard's metrics and every processor metric that says something about loops are shown.
    assert {
        "otel_guard_decisions_total",
        "otel_guard_chain_depth_bucket",
        "otel_guard_budget_store_errors_total",
        "otel_guard_budget_spend_total",
        "otel_guard_budget_unpriced_total",
    } <= used
    assert {
        "otel_guard_cycles_total",
        "otel_guard_delegations_total",
        "otel_guard_span_decisions_total",
        "otel_guard_processor_spans_total",
    } <= used


def test_guard_metric_labels_are_the_ones_the_dashboard_selects() -> None:
    """The labels the dashboard and alerts select and group by are on the guard's exported series."""
    samples = guard_samples()
    label_names = {name for labels in samples["otel_guard_decisions_total"] for name, _ in labels}
    assert {
        "otel_guard_decision",
        "otel_guard_reason",
        "gen_ai_agent_name",
        "gen_ai_tool_name",
    } <= label_names
    decisions = {dict(labels)["otel_guard_decision"] for labels in samples["otel_guard_decisions_total"]}
    assert decisions == {"allow", "would_refuse", "refuse"}
    # A spent tree budget is reason "budget", refused in enforce mode and would_refuse in observe mode.
    budget = {
        dict(labels)["otel_guard_decision"]
        for labels in samples["otel_guard_decisions_total"]
        if dict(labels).get("otel_guard_reason") == "budget"
    }
    assert budget == {"would_refuse", "refuse"}
    # A budget check that could not reach its store: one series per error type.
    store_errors = [dict(labels) for labels in samples["otel_guard_budget_store_errors_total"]]
    assert [labels["error_type"] for labels in store_errors] == ["StoreError"]
    # What a tree spent, by currency and model; and a response no price covered, by model only.
    spend = [dict(labels) for labels in samples["otel_guard_budget_spend_total"]]
    assert [(labels["cost_currency"], labels["gen_ai_request_model"]) for labels in spend] == [
        ("USD", "priced")
    ]
    unpriced = [dict(labels) for labels in samples["otel_guard_budget_unpriced_total"]]
    assert [labels["gen_ai_request_model"] for labels in unpriced] == ["homegrown"]
    assert "cost_currency" not in unpriced[0]
    # The OpenTelemetry SDK's exporter writes bucket bounds as floats ("6.0"); the alert on chain
    # depth matches both that and the Collector's "6".
    bounds = {dict(labels)["le"] for labels in samples["otel_guard_chain_depth_bucket"]}
    assert "6.0" in bounds
