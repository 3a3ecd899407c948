"""The Prometheus alert rules: promtool accepts them, their unit tests pass, every alert is tested,
and the unit tests catch the mistakes the rules are written to avoid: an event alert blind to a
series born at 1, and a loop that fires more than one alert (one per name it touched, per source,
per processor instance)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import live_stack
import pytest
import yaml
from dashboard_files import PROMETHEUS_RULE_TESTS, PROMETHEUS_RULES, load_yaml, prometheus_rules
from live_stack import require_binary

SEVERITIES = {"info", "warning", "critical"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", str(PROMETHEUS_RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(prometheus_rules())} rules found" in result.stdout


def test_the_rules_pass_their_unit_tests() -> None:
    result = promtool("test", "rules", str(PROMETHEUS_RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    """Each alert has a unit test in which it fires and one moment in which it must not."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in load_yaml(PROMETHEUS_RULE_TESTS)["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in prometheus_rules()}
    assert alerts - firing == set(), "alerts never shown firing"
    assert alerts - quiet == set(), "alerts never shown quiet"


def test_every_alert_says_what_happened_and_how_bad_it_is() -> None:
    names = [rule["alert"] for rule in prometheus_rules()]
    assert len(set(names)) == len(names)
    for rule in prometheus_rules():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["labels"]["component"] == "otel-guard", rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert len(rule["annotations"]["description"]) > 80, rule["alert"]


def test_rule_groups_follow_the_global_evaluation_interval() -> None:
    # A fixed group interval would slow the end-to-end test's 1 s evaluation to the group's.
    for group in load_yaml(PROMETHEUS_RULES)["groups"]:
        assert "interval" not in group, group["name"]


def _rules_with(alert: str, **changes: str) -> dict[str, Any]:
    """The rules file with the fields of one alert changed."""
    rules: dict[str, Any] = load_yaml(PROMETHEUS_RULES)
    found = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule.update(changes)
                found += 1
    assert found == 1, alert
    return rules


def _unit_tests_of(rules: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """promtool's unit tests run against ``rules`` in place of the shipped rules file."""
    (tmp_path / PROMETHEUS_RULES.name).write_text(yaml.safe_dump(rules))
    shutil.copy(PROMETHEUS_RULE_TESTS, tmp_path / PROMETHEUS_RULE_TESTS.name)
    return promtool("test", "rules", str(tmp_path / PROMETHEUS_RULE_TESTS.name))


def test_unit_tests_catch_an_alert_blind_to_a_cycle_counted_for_the_first_time(tmp_path: Path) -> None:
    """A counter the processor creates at its first count is born at 1; increase() alone never sees
    it change, so the first occurrence of a cycle would never alert. The unit tests say so."""
    naive = "sum by (job, instance, kind, cycle) (increase(otel_guard_cycles_total[15m])) > 0"
    result = _unit_tests_of(_rules_with("OtelGuardCycleDetected", expr=naive), tmp_path)
    assert result.returncode != 0, result.stdout
    # promtool reports the failed checks on stderr.
    assert "alertname: OtelGuardCycleDetected, time: 10m," in result.stderr


def test_a_missing_prometheus_tool_fails_the_test_and_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(os, "access", lambda _path, _mode: False)
    with pytest.raises(pytest.fail.Exception, match=r"promtool is not installed.*'prometheus' package"):
        live_stack.require_binary("promtool")


# The would-refuse alerts' main selectors: every reason, each alert from its own source.
WOULD_REFUSE_SELECTORS = {
    "OtelGuardWouldRefuse": 'otel_guard_decisions_total{otel_guard_decision="would_refuse"}',
    "OtelGuardWouldRefuseInTraces": 'otel_guard_span_decisions_total{decision="would_refuse"}',
}


def _expr(alert: str) -> str:
    return next(str(rule["expr"]) for rule in prometheus_rules() if rule["alert"] == alert)


def _failed_checks(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The checks promtool reports failed (on stderr): ``alertname: X, time: T,`` or ``expr: E, time: T,``."""
    return [
        line.strip()
        for line in result.stderr.splitlines()
        if line.strip().startswith(("alertname:", "expr:"))
    ]


@pytest.mark.parametrize("alert", sorted(WOULD_REFUSE_SELECTORS))
def test_unit_tests_catch_a_would_refuse_alert_blind_to_budget(alert: str, tmp_path: Path) -> None:
    """The would-refuse alerts take every reason; one limited to the reasons that came before tree
    budgets (cycle, depth, name_depth) would miss a tree past max_hops. The unit tests say so."""
    selector = WOULD_REFUSE_SELECTORS[alert]
    reason = "otel_guard_reason" if alert == "OtelGuardWouldRefuse" else "reason"
    expr = _expr(alert)
    assert expr.count(selector) == 3  # the series born in the window, the one before it, increase()
    limited = expr.replace(selector, selector[:-1] + f', {reason}=~"cycle|depth|name_depth"}}')
    result = _unit_tests_of(_rules_with(alert, expr=limited), tmp_path)
    assert result.returncode != 0, result.stdout
    # What fails is the tree past its budget, and only that: in pricing-agents from the guard's
    # metric, in the spans of an unscraped service from the processor's.
    times = {"OtelGuardWouldRefuse": ["13m", "24m"], "OtelGuardWouldRefuseInTraces": ["23m", "34m"]}[alert]
    assert _failed_checks(result) == [f"alertname: {alert}, time: {t}," for t in times], result.stderr


def _replaced(alert: str, old: str, new: str) -> dict[str, str]:
    expr = _expr(alert)
    assert expr.count(old) == 1, (alert, old)
    return {"expr": expr.replace(old, new)}


def _cut_at(alert: str, clause: str) -> dict[str, str]:
    """The alert's expression without its last ``unless``: the clause leaving a loop to the cycle alert."""
    expr = _expr(alert)
    assert expr.count(clause) == 1, (alert, clause)
    return {"expr": expr.split(clause)[0] + "\n"}


# A regrouping that lets one loop fire more than once, and the check of the unit tests that fails for it.
ONE_LOOP_MANY_ALERTS: dict[str, tuple[str, Callable[[], dict[str, str]], str]] = {
    "a cycle alert per processor instance and kind": (
        "OtelGuardCycleDetected",
        lambda: _replaced(
            "OtelGuardCycleDetected", "sum by (job, cycle)", "sum by (job, instance, kind, cycle)"
        ),
        "alertname: OtelGuardCycleDetected, time: 13m,",
    ),
    "the guard's would-refuse per agent, tool and reason": (
        "OtelGuardWouldRefuse",
        lambda: _replaced(
            "OtelGuardWouldRefuse",
            "sum by (job) (",
            "sum by (job, gen_ai_agent_name, gen_ai_tool_name, otel_guard_reason) (",
        ),
        "alertname: OtelGuardWouldRefuse, time: 13m,",
    ),
    "would-refuse in traces per agent and reason": (
        "OtelGuardWouldRefuseInTraces",
        lambda: _replaced(
            "OtelGuardWouldRefuseInTraces",
            "sum by (job, instance) (",
            "sum by (job, instance, agent, reason) (",
        ),
        "alertname: OtelGuardWouldRefuseInTraces, time: 23m,",
    ),
    "the guard's would-refuse beside the loop's alert": (
        "OtelGuardWouldRefuse",
        lambda: _cut_at("OtelGuardWouldRefuse", "\nunless on (job)\n"),
        "alertname: OtelGuardWouldRefuse, time: 20m,",
    ),
    "would-refuse in traces beside the loop's alert": (
        "OtelGuardWouldRefuseInTraces",
        lambda: _cut_at("OtelGuardWouldRefuseInTraces", "\nunless on (job, instance)\n"),
        "alertname: OtelGuardWouldRefuseInTraces, time: 15m,",
    ),
    "the guard's would-refuse firing before the spans arrive": (
        "OtelGuardWouldRefuse",
        lambda: {"for": "0s"},
        'expr: "ALERTS", time: 10m,',
    ),
}


@pytest.mark.parametrize("mistake", sorted(ONE_LOOP_MANY_ALERTS))
def test_unit_tests_catch_a_loop_that_fires_more_than_one_alert(mistake: str, tmp_path: Path) -> None:
    """One loop is one alert, whatever agents and tools it touches and whichever source sees it first;
    each way back to an alert per name, per instance or per source fails the unit tests."""
    alert, changes, failed_check = ONE_LOOP_MANY_ALERTS[mistake]
    result = _unit_tests_of(_rules_with(alert, **changes()), tmp_path)
    assert result.returncode != 0, result.stdout
    assert failed_check in _failed_checks(result), result.stderr


def test_unit_tests_catch_a_store_error_alert_that_fires_on_a_blip(tmp_path: Path) -> None:
    """Without its `for`, the budget store alert fires on a blip of two errors and while the errors
    have just begun; the unit tests say so."""
    result = _unit_tests_of(_rules_with("OtelGuardBudgetStoreErrors", **{"for": "0s"}), tmp_path)
    assert result.returncode != 0, result.stdout
    assert "alertname: OtelGuardBudgetStoreErrors, time: 15m," in result.stderr
    assert 'job="blip-agents"' in result.stderr
