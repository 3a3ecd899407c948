"""The dashboards' files as the tests read them: the Grafana dashboard, both sets of alert rules, the
provisioning files, and the PromQL in them with Grafana's template variables substituted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
DASHBOARD_JSON = DASHBOARDS / "grafana" / "otel-guard-recursion.json"
PROVISIONING = DASHBOARDS / "grafana" / "provisioning"
GRAFANA_ALERTING = PROVISIONING / "alerting" / "otel-guard.yaml"
GRAFANA_DATASOURCES = PROVISIONING / "datasources" / "prometheus.yaml"
GRAFANA_DASHBOARD_PROVIDERS = PROVISIONING / "dashboards" / "otel-guard.yaml"
PROMETHEUS_RULES = DASHBOARDS / "prometheus" / "otel-guard-rules.yaml"
PROMETHEUS_RULE_TESTS = DASHBOARDS / "prometheus" / "otel-guard-rules.test.yaml"

# Variables Grafana defines itself; a dashboard may use them without declaring them.
GRAFANA_BUILTINS = frozenset({"__range", "__range_s", "__rate_interval", "__interval", "__interval_ms"})

# $name, ${name} and ${name:format}; not $1, label_replace's reference to its regex's first group
# (Grafana leaves a $name that names no variable as it is).
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::[\w]+)?\}|([A-Za-z_]\w*))")


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as stream:
        return yaml.safe_load(stream)


def load_dashboard() -> dict[str, Any]:
    with DASHBOARD_JSON.open(encoding="utf-8") as stream:
        dashboard: dict[str, Any] = json.load(stream)
    return dashboard


def all_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included, with the panels of collapsed rows."""
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def content_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The panels that show data: all but rows."""
    return [panel for panel in all_panels(dashboard) if panel["type"] != "row"]


def panel(dashboard: Mapping[str, Any], title: str) -> dict[str, Any]:
    matches = [p for p in content_panels(dashboard) if p["title"] == title]
    assert len(matches) == 1, f"expected one panel titled {title!r}, found {len(matches)}"
    return matches[0]


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it stands, for messages."""

    where: str
    expr: str


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[Query]:
    return [
        Query(f"dashboard panel {p['title']!r} target {t['refId']}", t["expr"])
        for p in content_panels(dashboard)
        for t in p["targets"]
    ]


def prometheus_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(PROMETHEUS_RULES)["groups"] for rule in group["rules"]]


def grafana_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = load_yaml(GRAFANA_ALERTING)["groups"]
    return groups


def grafana_rules() -> list[dict[str, Any]]:
    return [rule for group in grafana_groups() for rule in group["rules"]]


def grafana_prometheus_queries(rule: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The data source queries of a Grafana-managed rule (not its server-side expressions)."""
    return [query for query in rule["data"] if query["datasourceUid"] != "__expr__"]


def alert_queries() -> list[Query]:
    queries = [Query(f"Prometheus rule {r['alert']}", r["expr"]) for r in prometheus_rules()]
    queries += [
        Query(f"Grafana rule {r['title']} query {q['refId']}", q["model"]["expr"])
        for r in grafana_rules()
        for q in grafana_prometheus_queries(r)
    ]
    return queries


def variables_in(expr: str) -> set[str]:
    return {braced or bare for braced, bare in VARIABLE.findall(expr)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """The expression as Grafana sends it, each template variable replaced by ``values[name]``."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for the template variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(value, expr)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OUR_METRIC = re.compile(r"\b(otel_guard_\w+|up)\b")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (ours, and ``up``): label names and strings left out."""
    text = _LABEL_LISTS.sub(" ", _MATCHERS.sub(" ", _STRING.sub('""', expr)))
    return set(_OUR_METRIC.findall(text))


def iter_label_values_queries(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(variable, metric, label) of every ``label_values(metric, label)`` variable."""
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
        assert match, f"variable {variable['name']}: unexpected query {query!r}"
        yield variable["name"], match.group(1), match.group(2)
