"""Two processes sharing one tree's money on a real redis-server (issue 44.5).

Each process makes model requests in the tree one after another, a response taking a few
milliseconds; together they want twice the tree's ``max_cost``. The store checks each request against
the tree's spend before it starts and adds the response's price after, so the tree ends past its cap
by at most the responses in flight when it was crossed: one a process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import propagate
from redis_server import RedisServer

import otel_guard
from otel_guard import delegate

pytestmark = pytest.mark.integration

PROGRAM = Path(__file__).parent / "programs" / "spend_money.py"
REPO = PROGRAM.parents[3]
PRICES = '{"acme-*": {"input": 10, "output": 100}}'
PER_RESPONSE = 1000 * 10 + 100 * 100  # 20,000 micro-units
MAX_COST = 500_000  # 0.5: 25 responses


def run_processes(
    redis_server: RedisServer, carrier: dict[str, str], prices: str, processes: int
) -> list[dict[str, Any]]:
    """Run ``processes`` copies of programs/spend_money.py at once, in the tree of ``carrier``."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "OTEL_GUARD_BUDGET_STORE": f"{redis_server.url}?socket_timeout=2",
        "OTEL_GUARD_BUDGET_ON_ERROR": "refuse",
        "OTEL_GUARD_MAX_COST": "0.5",
        "OTEL_GUARD_PRICES": prices,
        "OTEL_TRACES_EXPORTER": "none",
    }
    running: list[subprocess.Popen[str]] = []
    results = []
    try:
        for index in range(processes):
            payload = {
                "carrier": carrier,
                "agent": f"worker{index}",
                "requests": 40,
                "model": "acme-large",
                "input_tokens": 1000,
                "output_tokens": 100,
                "in_flight": 0.005,
            }
            process = subprocess.Popen(
                [sys.executable, str(PROGRAM)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO,
            )
            running.append(process)
            assert process.stdin is not None
            process.stdin.write(json.dumps(payload) + "\n")
            process.stdin.flush()
        for process in running:  # every process is in the tree before any spends
            assert process.stdout is not None
            ready = process.stdout.readline().strip()
            assert ready == "ready", process.stderr.read() if process.stderr else ""
        for process in running:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in running:
            out, err = process.communicate(timeout=25)
            assert process.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def test_two_processes_never_overspend_a_tree_by_more_than_the_responses_in_flight(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(PRICES)
    otel_guard.configure(
        budget_store=f"{redis_server.url}?socket_timeout=2", max_cost="0.5", prices=str(prices)
    )
    carrier: dict[str, str] = {}
    with delegate("planner") as planner:
        assert planner.chain is not None
        propagate.inject(carrier)
    results = run_processes(redis_server, carrier, str(prices), processes=2)
    spent = int(redis_server.client().get(f"tree:default:{planner.chain.root}:cost"))
    made = sum(result["made"] for result in results)
    assert spent == made * PER_RESPONSE  # every response made was counted, once
    assert MAX_COST <= spent <= MAX_COST + len(results) * PER_RESPONSE
    assert all("max_cost 0.5" in str(result["refused"]) for result in results)
    assert all(result["made"] > 0 for result in results)  # both spent: they shared the tree
