"""The dashboards against a real Prometheus fed by the real processor and the real inline guard.

The guarded program (guarded_metrics_app.py) runs planner > budget > planner in observe mode (a
would-refuse), a chain six deep, and summarize > summarize in enforce mode (a refusal); then, with
max_hops 2, a tree whose third hop (the web_search tool) is a would-refuse for budget in observe
mode and a tree whose third hop (escalate) is refused for budget in enforce mode; then, twice with a
scrape between, two hops whose budget store (Redis on a port where nothing listens) cannot be
reached; then a tree with max_cost 0.01 USD that has a response no price covers and two priced
responses of 0.006 USD, and whose next hop (booker) is refused for budget. Its spans go over
OTLP/gRPC to the processor; its metrics reach Prometheus through the OpenTelemetry Prometheus
exporter. The tests then ask Prometheus what the alerts and the dashboard
would show.
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
from live_stack import AGENTS_JOB, PROCESSOR_JOB, TEMPLATE_VALUES, Stack, eventually, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CROSS_FUNCTION = {"job": PROCESSOR_JOB, "cycle": "planner>budget>planner"}
DIRECT = {"job": PROCESSOR_JOB, "cycle": "summarize>summarize"}
STORE_ERRORS = {"job": AGENTS_JOB, "error_type": "StoreError"}
# One alert per loop. The observe-mode loop's would-refuse decisions (planner for cycle, in the guard's
# metric and in the spans) are left to its cycle alert, and with them the rest of travel-agents'
# would-refuse decisions of those 15 minutes (web_search for budget): the processor read its loop.
EXPECTED_ALERTS = {"OtelGuardCycleDetected": [CROSS_FUNCTION, DIRECT]}
# The store errors grew between two scrapes: the alert is pending, and would fire after its 5 minutes.
EXPECTED_PENDING = {"OtelGuardBudgetStoreErrors": [STORE_ERRORS]}


def _matches(alert: dict[str, Any], name: str, labels: dict[str, str]) -> bool:
    alert_labels: dict[str, str] = alert["labels"]
    return alert_labels["alertname"] == name and labels.items() <= alert_labels.items()


def test_the_loops_fire_their_alerts_and_nothing_else_does(stack: Stack) -> None:
    wanted = [
        (state, name, labels)
        for state, expected_alerts in (("firing", EXPECTED_ALERTS), ("pending", EXPECTED_PENDING))
        for name, sets in expected_alerts.items()
        for labels in sets
    ]

    def all_there() -> list[dict[str, Any]] | None:
        alerts = stack.prometheus.alerts()
        if all(
            any(a["state"] == state and _matches(a, n, labels) for a in alerts) for state, n, labels in wanted
        ):
            return alerts
        return None

    alerts = wait_for("the cycle and budget store alerts", all_there, timeout=60)
    # Exactly the expected alert instances, and none other firing or pending: no would-refuse alert
    # beside the loop's (not even pending), no health alert, no refusal spike for one refusal, no
    # depth alert for a chain six deep, no alert on invalid chains for a refusal for budget.
    got = sorted((a["labels"]["alertname"], a["state"]) for a in alerts)
    expected = sorted((name, state) for state, name, _labels in wanted)
    assert got == expected, alerts
    cycle = next(a for a in alerts if _matches(a, "OtelGuardCycleDetected", CROSS_FUNCTION))
    assert cycle["labels"]["severity"] == "warning"
    assert cycle["annotations"]["summary"] == "Delegation loop planner>budget>planner found in traces"
    assert cycle["annotations"]["dashboard_url"].endswith("&var-cycle=planner%3Ebudget%3Eplanner")
    store = next(a for a in alerts if _matches(a, "OtelGuardBudgetStoreErrors", STORE_ERRORS))
    assert store["labels"]["severity"] == "warning"
    assert store["annotations"]["summary"] == f"{AGENTS_JOB} cannot reach its budget store (StoreError)"


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
    expected = {
        "service": [AGENTS_JOB],
        "processor": [stack.processor_metrics],
        "cycle": sorted([CROSS_FUNCTION["cycle"], DIRECT["cycle"]]),
    }
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
        # A loop and a spent tree budget each.
        assert view.value("Would-refuse (guard)") == 2
        assert view.value("Would-refuse (traces)") == 2
        assert view.value("Refused (guard)") == 3
        assert view.value("Refused (traces)") == 3
        # Chains ran six deep at most: the 99th percentile lies in the bucket (5, 6].
        assert 5 < view.value("Chain depth, p99") <= 6

        assert view.by("Cycles in the time range", "kind", "cycle") == cycles
        assert set(view.by("Cycles by kind and cycle", "kind", "cycle")) == set(cycles)
        edges = view.by("Delegation edges (caller → callee)", "caller", "callee")
        for edge in [("planner", "search"), ("planner", "budget"), ("budget", "planner"), ("step5", "step6")]:
            assert edges.get(edge) == 1, edges
        assert ("planner", "step1") not in edges  # separate delegation trees are not joined

        assert view.by("Would-refuse by agent and reason (guard)", "name", "otel_guard_reason") == {
            ("planner", "cycle"): 1,
            ("web_search", "budget"): 1,
        }
        assert view.by("Refusals by agent and reason (guard)", "name", "otel_guard_reason") == {
            ("summarize", "cycle"): 1,
            ("escalate", "budget"): 1,
            ("booker", "budget"): 1,
        }
        assert view.by("Would-refuse and refusals in traces", "decision", "agent", "reason") == {
            ("would_refuse", "planner", "cycle"): 1,
            ("refuse", "summarize", "cycle"): 1,
            ("would_refuse", "web_search", "budget"): 1,
            ("refuse", "escalate", "budget"): 1,
            ("refuse", "booker", "budget"): 1,
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


def test_the_dashboard_shows_the_budgets(stack: Stack) -> None:
    view = DashboardView(stack)

    def check() -> None:
        # Only the hops past a budget, by decision and agent or tool: the loops' are not among them.
        assert view.by(
            "Budget refusals and would-refuse by agent (guard)", "otel_guard_decision", "name"
        ) == {
            ("would_refuse", "web_search"): 1,
            ("refuse", "escalate"): 1,
            ("refuse", "booker"): 1,
        }
        # Two steps of two hops each, every hop one error; the series was born at the first step's 2.
        assert view.by("Budget store errors by error type", "error_type") == {("StoreError",): 4}
        # budget_on_error allow: each hop whose store could not be reached was allowed, and ran.
        metric = f'otel_guard_decisions_total{{job="{AGENTS_JOB}"}}'
        decided = stack.prometheus.vector(
            f'sum by (otel_guard_decision, name) (label_join({metric}, "name", "", "gen_ai_agent_name", '
            '"gen_ai_tool_name"))'
        )
        hops = {
            (m["otel_guard_decision"], m["name"]): v for m, v in decided if m["name"] in {"ledger", "invoice"}
        }
        assert hops == {("allow", "ledger"): 2, ("allow", "invoice"): 2}

    eventually(check, timeout=30)


def test_the_dashboard_shows_the_trees_spend(stack: Stack) -> None:
    view = DashboardView(stack)

    def check() -> None:
        # Two responses of 0.006 USD, priced from the prices file: what the tree's store took.
        spend = view.by("Tree spend by model and currency", "cost_currency", "gen_ai_request_model")
        assert set(spend) == {("USD", "travel-llm")}
        assert round(spend[("USD", "travel-llm")] * 1_000_000) == 12_000
        # The response no price covered is there, and not among the spend.
        assert view.by("Unpriced responses by model", "gen_ai_request_model") == {("homegrown-llm",): 1}
        # The hop into booker, past max_cost, and the spent max_hops trees of the budgets step.
        assert view.by("Budget refusals in the time range (guard)", "otel_guard_decision") == {
            ("refuse",): 2,
            ("would_refuse",): 1,
        }

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
