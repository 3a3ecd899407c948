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


def _rules_with_cycle_expr(expr: str) -> dict[str, Any]:
    rules: dict[str, Any] = load_yaml(PROMETHEUS_RULES)
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "OtelGuardCycleDetected":
                rule["expr"] = expr
    return rules


def test_unit_tests_catch_an_alert_blind_to_a_cycle_counted_for_the_first_time(tmp_path: Path) -> None:
    """A counter the processor creates at its first count is born at 1; increase() alone never sees
    it change, so the first occurrence of a cycle would never alert. The unit tests say so."""
    naive = "sum by (job, instance, kind, cycle) (increase(otel_guard_cycles_total[15m])) > 0"
    (tmp_path / PROMETHEUS_RULES.name).write_text(yaml.safe_dump(_rules_with_cycle_expr(naive)))
    shutil.copy(PROMETHEUS_RULE_TESTS, tmp_path / PROMETHEUS_RULE_TESTS.name)
    result = promtool("test", "rules", str(tmp_path / PROMETHEUS_RULE_TESTS.name))
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
