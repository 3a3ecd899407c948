"""The dashboards against a real Prometheus fed by the real processor and the real inline guard.

The guarded program (guarded_metrics_app.py) runs planner > budget > planner in observe mode (a
would-refuse), a chain six deep, and summarize > summarize in enforce mode (a refusal). Its spans
go over OTLP/gRPC to the processor; its metrics reach Prometheus through the OpenTelemetry
Prometheus exporter. The tests then ask Prometheus what the alerts and the dashboard would show.
"""

from __future__ import annotations

from typing import Any

import pytest
from dashboard_files import (
    alert_queries,
    dashboard_queries,
    iter_label_values_queries,
    load_dashboard,
    panel,
    substitute,
)
from live_stack import AGENTS_JOB, PROCESSOR_JOB, Stack, eventually, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# What Grafana would put in the expressions: every service and processor, a 10-minute time range
# (the whole test run), and a rate interval of a minute (well over four 1 s scrapes).
TEMPLATE_VALUES = {
    "service": ".*",
    "processor": ".*",
    "max_depth": "8",
    "__range": "10m",
    "__rate_interval": "1m",
    "__interval": "15s",
}

CROSS_FUNCTION = {"kind": "cross_function", "cycle": "planner>budget>planner"}
DIRECT = {"kind": "direct", "cycle": "summarize>summarize"}
EXPECTED_ALERTS = {
    "OtelGuardCycleDetected": [CROSS_FUNCTION, DIRECT],
    "OtelGuardWouldRefuseInTraces": [{"agent": "planner", "reason": "cycle", "job": PROCESSOR_JOB}],
    "OtelGuardWouldRefuse": [{"agent": "planner", "otel_guard_reason": "cycle", "job": AGENTS_JOB}],
}


def _matches(alert: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
    alert_labels: dict[str, str] = alert["labels"]
    return alert_labels["alertname"] == name and labels.items() <= alert_labels.items()


def test_the_loops_fire_their_alerts_and_nothing_else_does(stack: Stack) -> None:
    def all_firing() -> list[dict[str, Any]] | None:
        alerts = stack.prometheus.alerts()
        firing = [a for a in alerts if a["state"] == "firing"]
        wanted = [(n, labels) for n, sets in EXPECTED_ALERTS.items() for labels in sets]
        if all(any(_matches(a, n, labels) for a in firing) for n, labels in wanted):
            return alerts
        return None

    alerts = wait_for("the cycle and would-refuse alerts to fire", all_firing, timeout=60)
    # Exactly the expected alert instances, and none other firing or pending: no health alert, no
    # refusal spike for one refusal, no depth alert for a chain six deep.
    got = sorted((a["labels"]["alertname"], a["state"]) for a in alerts)
    expected = sorted((name, "firing") for name, sets in EXPECTED_ALERTS.items() for _ in sets)
    assert got == expected, alerts
    cycle = next(a for a in alerts if _matches(a, "OtelGuardCycleDetected", CROSS_FUNCTION))
    assert cycle["labels"]["severity"] == "warning"
    assert cycle["labels"]["job"] == PROCESSOR_JOB
    assert cycle["labels"]["instance"] == stack.processor_metrics
    assert cycle["annotations"]["summary"] == (
        "Delegation cycle planner>budget>planner (cross_function) found in traces"
    )


def test_every_dashboard_and_alert_query_is_valid_promql(stack: Stack) -> None:
    """Prometheus itself accepts and evaluates each expression, on data, with variables substituted."""
    queries = dashboard_queries(load_dashboard()) + alert_queries()
    failures = []
    for query in queries:
        answer = stack.prometheus.query(substitute(query.expr, TEMPLATE_VALUES))
        if answer["status"] != "success":
            failures.append(f"{query.where}: {answer.get('errorType')}: {answer.get('error')}")
    assert not failures, "\n".join(failures)


def test_template_variables_list_the_service_and_the_processor(stack: Stack) -> None:
    expected = {"service": [AGENTS_JOB], "processor": [stack.processor_metrics]}
    for name, metric, label in iter_label_values_queries(load_dashboard()):
        # What Grafana asks Prometheus for label_values(metric, label).
        answer = stack.prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert answer["status"] == "success"
        assert answer["data"] == expected[name], name


class DashboardView:
    """The dashboard's panels evaluated by Prometheus now, as Grafana would show them."""

    def __init__(self, stack: Stack) -> None:
        self.prometheus = stack.prometheus
        self.dashboard = load_dashboard()

    def series(self, title: str, ref_id: str = "A") -> list[tuple[dict[str, str], float]]:
        targets = panel(self.dashboard, title)["targets"]
        expr = next(t["expr"] for t in targets if t["refId"] == ref_id)
        return self.prometheus.vector(substitute(expr, TEMPLATE_VALUES))

    def by(self, title: str, *labels: str, ref_id: str = "A") -> dict[tuple[str, ...], float]:
        return {tuple(m.get(k, "") for k in labels): v for m, v in self.series(title, ref_id)}

    def value(self, title: str) -> float:
        (only,) = self.series(title)
        return only[1]


def test_the_dashboard_shows_the_loops(stack: Stack) -> None:
    view = DashboardView(stack)
    cycles = {("cross_function", "planner>budget>planner"): 1.0, ("direct", "summarize>summarize"): 1.0}

    def check() -> None:
        assert view.value("Cycles found in traces") == 2
        assert view.value("Would-refuse (guard)") == 1
        assert view.value("Would-refuse (traces)") == 1
        assert view.value("Refused (guard)") == 1
        assert view.value("Refused (traces)") == 1
        # Chains ran six deep at most: the 99th percentile lies in the bucket (5, 6].
        assert 5 < view.value("Chain depth, p99") <= 6

        assert view.by("Cycles in the time range", "kind", "cycle") == cycles
        assert set(view.by("Cycles by kind and cycle", "kind", "cycle")) == set(cycles)
        edges = view.by("Delegation edges (caller → callee)", "caller", "callee")
        for edge in [("planner", "search"), ("planner", "budget"), ("budget", "planner"), ("step5", "step6")]:
            assert edges.get(edge) == 1, edges
        assert ("planner", "step1") not in edges  # separate delegation trees are not joined

        assert view.by("Would-refuse by agent and reason (guard)", "name", "otel_guard_reason") == {
            ("planner", "cycle"): 1
        }
        assert view.by("Refusals by agent and reason (guard)", "name", "otel_guard_reason") == {
            ("summarize", "cycle"): 1
        }
        assert view.by("Would-refuse and refusals in traces", "decision", "agent", "reason") == {
            ("would_refuse", "planner", "cycle"): 1,
            ("refuse", "summarize", "cycle"): 1,
        }
        assert set(view.by("Hops decided per second", "otel_guard_decision")) == {
            ("allow",),
            ("would_refuse",),
            ("refuse",),
        }
        # Every hop decided is a hop in the depth histogram, none deeper than 6.
        depths = view.by("Hops by chain depth", "le")
        decided = stack.prometheus.vector(f'sum(otel_guard_decisions_total{{job="{AGENTS_JOB}"}})')[0][1]
        assert depths[("+Inf",)] == decided
        assert depths[("6.0",)] == decided
        assert depths[("5.0",)] < decided

    eventually(check, timeout=30)


def test_the_dashboard_shows_the_processor_at_work(stack: Stack) -> None:
    view = DashboardView(stack)

    def check() -> None:
        outcomes = view.by("Spans by outcome", "outcome")
        assert outcomes[("received",)] > 0
        assert outcomes[("rejected",)] == 0
        # These series are born with the first request, so their rate over the one export request
        # of the test is 0: the series are there, by protocol and outcome.
        assert set(view.by("Export requests by protocol and outcome", "protocol", "outcome")) == {
            ("grpc", "ok")
        }
        assert set(view.by("Received bytes", "protocol")) == {("grpc",)}
        assert view.value("Detection errors") == 0
        traces_held = view.series("Detection state", "A")[0][1]
        spans_held = view.series("Detection state", "B")[0][1]
        # The planner tree, the deep chain and the summarize tree, held until their TTL.
        assert traces_held >= 3
        assert spans_held >= traces_held

    eventually(check, timeout=30)
