"""Fixtures of the dashboards' tests: one live stack for the session (the otel-guard processor, a
program running the inline guard, and a real Prometheus scraping both with the alert rules loaded).

The stack is built in the order production sees it: Prometheus scrapes the processor and the
program before any agent delegates, so every loop arrives as new series while it watches. The
program then runs its steps (guarded_metrics_app.py): the loops, the spent tree budgets, and twice
the hops whose budget store is down, with a scrape between the two, so that Prometheus sees the
store errors grow; then a tree's spend past its max_cost.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from dashboard_files import PROMETHEUS_RULES
from live_stack import (
    AGENTS_JOB,
    PROCESSOR_JOB,
    Process,
    PrometheusServer,
    Stack,
    free_port,
    start_processor,
    wait_for,
)

APP = Path(__file__).with_name("guarded_metrics_app.py")


def _target_up(prometheus: PrometheusServer, job: str) -> bool | None:
    result = prometheus.vector(f'up{{job="{job}"}} == 1')
    return True if result else None


def _printed(process: Process, line: str) -> bool | None:
    process.check_running()
    return True if line in process.output().splitlines() else None


def _run_step(app: Process, step: str, done: str | None = None) -> None:
    """Have the guarded program run one step, and wait until it has exported the step's spans."""
    assert app.popen.stdin is not None
    app.popen.stdin.write(f"{step}\n".encode())
    app.popen.stdin.flush()
    line = done or f"{step} done"
    wait_for(f"the guarded program's step {step} ({line!r})", lambda: _printed(app, line), 30)


def _scraped_spend(prometheus: PrometheusServer) -> bool | None:
    expr = f'sum(otel_guard_budget_spend_total{{job="{AGENTS_JOB}"}}) > 0'
    return True if prometheus.vector(expr) else None


def _scraped_store_errors(prometheus: PrometheusServer, count: int) -> bool | None:
    expr = f'sum(otel_guard_budget_store_errors_total{{job="{AGENTS_JOB}"}}) == {count}'
    return True if prometheus.vector(expr) else None


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("dashboards-stack")
    processes: list[Process] = []
    with ExitStack() as cleanup:
        try:
            processor, grpc_address, processor_metrics = start_processor(workdir)
            processes.append(processor)
            cleanup.callback(processor.stop)
            app_port = free_port()
            prometheus = PrometheusServer(
                workdir,
                {PROCESSOR_JOB: processor_metrics, AGENTS_JOB: f"127.0.0.1:{app_port}"},
                [PROMETHEUS_RULES],
            )
            processes.append(prometheus.process)
            cleanup.callback(prometheus.stop)
            prometheus.wait_ready()
            wait_for("Prometheus to scrape the processor", lambda: _target_up(prometheus, PROCESSOR_JOB), 30)
            app = Process(
                "guarded agents",
                [sys.executable, str(APP), grpc_address, str(app_port)],
                workdir / "app.log",
                stdin=True,
            )
            processes.append(app)
            cleanup.callback(app.stop)
            wait_for("the guarded program to serve /metrics", lambda: _printed(app, "serving"), 30)
            wait_for(
                "Prometheus to scrape the guarded program", lambda: _target_up(prometheus, AGENTS_JOB), 30
            )
            _run_step(app, "loops")
            _run_step(app, "budgets")
            _run_step(app, "store_errors", "store_errors done: 2")
            wait_for(
                "Prometheus to scrape the first budget store errors",
                lambda: _scraped_store_errors(prometheus, 2),
                30,
            )
            _run_step(app, "store_errors", "store_errors done: 4")
            wait_for(
                "Prometheus to scrape the later budget store errors",
                lambda: _scraped_store_errors(prometheus, 4),
                30,
            )
            _run_step(app, "spend")
            wait_for("Prometheus to scrape the tree's spend", lambda: _scraped_spend(prometheus), 30)
        except (TimeoutError, RuntimeError, AssertionError) as error:
            logs = "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail()}" for p in processes)
            pytest.fail(f"the live stack did not come up: {error}\n{logs}")
        yield Stack(prometheus, processor, processor_metrics, app)
