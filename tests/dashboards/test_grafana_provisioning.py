"""Grafana's provisioning files: the data source, the dashboard provider, and the Grafana-managed
alert rules, which must mirror the Prometheus rules and link to panels that exist."""

from __future__ import annotations

import re
from typing import Any

import pytest
from dashboard_files import (
    GRAFANA_ALERTING,
    GRAFANA_DASHBOARD_PROVIDERS,
    GRAFANA_DATASOURCES,
    PROMETHEUS_RULES,
    all_panels,
    grafana_groups,
    grafana_prometheus_queries,
    grafana_rules,
    load_dashboard,
    load_yaml,
    prometheus_rules,
)

DATASOURCE_UID = "otel-guard-prometheus"
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(duration: str) -> float:
    """A Prometheus / Grafana duration such as ``1h30m`` in seconds; ValueError if it is not one."""
    parts = DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration!r}")
    return sum(int(n) * UNIT_SECONDS[u] for n, u in parts)


def test_duration_parser_rejects_what_grafana_rejects() -> None:
    assert seconds("1h30m") == 5400
    assert seconds("0s") == 0
    for bad in ("", "5", "5 m", "m5"):
        with pytest.raises(ValueError, match="not a duration"):
            seconds(bad)


def test_datasource_has_the_uid_the_alert_rules_name() -> None:
    document = load_yaml(GRAFANA_DATASOURCES)
    assert document["apiVersion"] == 1
    (datasource,) = document["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["uid"] == DATASOURCE_UID
    assert datasource["access"] == "proxy"
    assert datasource["url"].startswith("http")
    assert seconds(datasource["jsonData"]["timeInterval"]) > 0


def test_dashboard_provider_loads_the_dashboard_folder() -> None:
    document = load_yaml(GRAFANA_DASHBOARD_PROVIDERS)
    assert document["apiVersion"] == 1
    (provider,) = document["providers"]
    assert provider["type"] == "file"
    assert provider["folder"] == "otel-guard"
    assert provider["options"]["path"].startswith("/")


def test_grafana_rules_are_well_formed() -> None:
    document = load_yaml(GRAFANA_ALERTING)
    assert document["apiVersion"] == 1
    for group in grafana_groups():
        assert group["orgId"] == 1
        assert group["name"]
        assert group["folder"]
        assert seconds(group["interval"]) > 0
    uids = [rule["uid"] for rule in grafana_rules()]
    assert len(set(uids)) == len(uids)
    for rule in grafana_rules():
        title = rule["title"]
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", rule["uid"]), (
            f"{title}: Grafana uids are at most 40 chars"
        )
        ref_ids = [query["refId"] for query in rule["data"]]
        assert rule["condition"] in ref_ids, title
        for query in rule["data"]:
            assert query["model"]["refId"] == query["refId"], title
            assert query["datasourceUid"] in {DATASOURCE_UID, "__expr__"}, title
        for query in grafana_prometheus_queries(rule):
            assert query["model"]["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, title
            assert query["model"]["instant"] is True, f"{title}: one value per series, no reduce step"
        # As in Prometheus, every series the query returns is an alert, whatever its value
        # (OtelGuardProcessorDown's is 0): the query, a math node true for any number, and the
        # condition on it -- the shape Grafana's own conversion of Prometheus rules produces.
        nodes = {q["refId"]: q["model"] for q in rule["data"]}
        assert [q["refId"] for q in rule["data"]] == ["A", "B", "C"], title
        assert rule["condition"] == "C", title
        assert nodes["B"]["type"] == "math", title
        assert nodes["B"]["expression"] == "is_number($A) || is_nan($A) || is_inf($A)", title
        assert nodes["C"]["type"] == "threshold", title
        assert nodes["C"]["expression"] == "B", title
        assert nodes["C"]["conditions"][0]["evaluator"] == {"type": "gt", "params": [0]}, title
        # The expressions return nothing when all is well: that is OK, not NoData.
        assert rule["noDataState"] == "OK", title
        assert rule["execErrState"] in {"Error", "Alerting", "OK"}, title
        seconds(rule["for"])
        # Grafana expands ${VAR} in annotations and $VAR in labels from its environment.
        assert not any("${" in text for text in rule["annotations"].values()), title
        assert not any("$" in text for text in rule["labels"].values()), title


def test_grafana_rules_link_to_panels_of_the_dashboard() -> None:
    dashboard = load_dashboard()
    panel_ids = {panel["id"] for panel in all_panels(dashboard) if panel["type"] != "row"}
    for rule in grafana_rules():
        assert rule["dashboardUid"] == dashboard["uid"], rule["title"]
        assert rule["panelId"] in panel_ids, rule["title"]


def _by_name(rules: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {rule[key]: rule for rule in rules}


def test_grafana_rules_mirror_the_prometheus_rules() -> None:
    """Same alerts, same expressions, `for`, labels and annotations, in groups of the same name."""
    prometheus = _by_name(prometheus_rules(), "alert")
    grafana = _by_name(grafana_rules(), "title")
    assert set(grafana) == set(prometheus)
    for name, rule in prometheus.items():
        mirror = grafana[name]
        (query,) = grafana_prometheus_queries(mirror)
        assert query["model"]["expr"] == rule["expr"], name
        assert seconds(mirror["for"]) == seconds(rule.get("for", "0s")), name
        assert mirror["labels"] == rule["labels"], name
        assert mirror["annotations"] == rule["annotations"], name
    prometheus_groups = {
        group["name"]: {r["alert"] for r in group["rules"]} for group in load_yaml(PROMETHEUS_RULES)["groups"]
    }
    grafana_group_rules = {g["name"]: {r["title"] for r in g["rules"]} for g in grafana_groups()}
    assert grafana_group_rules == prometheus_groups
