"""The Prometheus alert rules: promtool accepts them, their unit tests pass, every alert is tested,
and the unit tests catch the mistake the rules are written to avoid."""

from __future__ import annotations

import os
import shutil
import subprocess
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


@pytest.mark.parametrize("alert", ["OtelGuardWouldRefuse", "OtelGuardWouldRefuseInTraces"])
def test_unit_tests_catch_a_would_refuse_alert_blind_to_budget(alert: str, tmp_path: Path) -> None:
    """The would-refuse alerts take every reason; one limited to the reasons that came before tree
    budgets (cycle, depth, name_depth) would miss a tree past max_hops. The unit tests say so."""
    reason = "otel_guard_reason" if alert == "OtelGuardWouldRefuse" else "reason"
    expr = next(rule["expr"] for rule in prometheus_rules() if rule["alert"] == alert)
    assert 'decision="would_refuse"}' in expr
    assert reason + "=" not in expr  # no reason filtered: budget included
    limited = expr.replace(
        'decision="would_refuse"}', f'decision="would_refuse", {reason}=~"cycle|depth|name_depth"}}'
    )
    result = _unit_tests_of(_rules_with(alert, expr=limited), tmp_path)
    assert result.returncode != 0, result.stdout
    # The one check that fails is the budget case's first would-refuse.
    failed = [line.strip() for line in result.stderr.splitlines() if "alertname:" in line]
    assert failed == [f"alertname: {alert}, time: 10m,"], result.stderr


def test_unit_tests_catch_a_store_error_alert_that_fires_on_a_blip(tmp_path: Path) -> None:
    """Without its `for`, the budget store alert fires on a blip of two errors and while the errors
    have just begun; the unit tests say so."""
    result = _unit_tests_of(_rules_with("OtelGuardBudgetStoreErrors", **{"for": "0s"}), tmp_path)
    assert result.returncode != 0, result.stdout
    assert "alertname: OtelGuardBudgetStoreErrors, time: 15m," in result.stderr
    assert 'job="blip-agents"' in result.stderr
