"""Real servers for the dashboards' tests, each a subprocess on 127.0.0.1 that its starter stops:
Prometheus (Debian's package), the otel-guard processor, and a small program running the inline guard.

Every wait is bounded; every process writes its output to a log file whose tail goes into the
failure message.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from ports import free_port

T = TypeVar("T")

PROCESSOR_JOB = "otel-guard-processor"  # the scrape job name the rules expect for the processor
AGENTS_JOB = "travel-agents"  # the scrape job of the guarded program

# What Grafana would put in the expressions: every service and processor, a 10-minute time range
# (the whole test run), and a rate interval of a minute (well over four 1 s scrapes).
TEMPLATE_VALUES = {
    "service": ".*",
    "processor": ".*",
    "cycle": ".*",
    "max_depth": "8",
    "__range": "10m",
    "__rate_interval": "1m",
    "__interval": "15s",
}

PROMETHEUS_PACKAGE_HINT = (
    "install Debian's 'prometheus' package (scripts/bootstrap does: apt-get install prometheus)"
)


def require_binary(name: str) -> str:
    """The path of a Prometheus tool; the test fails (never skips) when it is missing."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if path is None:
        pytest.fail(f"{name} is not installed, and the dashboards' tests need it: {PROMETHEUS_PACKAGE_HINT}")
    return path


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.25) -> T:
    """Call ``probe`` until it returns something other than None; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = probe()
        except (httpx.HTTPError, OSError) as error:
            result, last_error = None, error
        if result is not None:
            return result
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def eventually(check: Callable[[], None], timeout: float, interval: float = 0.5) -> None:
    """Run ``check`` until its assertions hold; after ``timeout`` seconds its last failure stands.

    Prometheus scrapes every second and rate() needs two scrapes of a series, so what a query
    shows trails what happened by a few seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)
        else:
            return


def _dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that the kernel sends it SIGTERM should pytest itself be killed.

    setpriv (util-linux, on every Debian) sets the parent-death signal and execs the command;
    the signal survives the exec. Where it is missing, the fixtures' own cleanup is all there is.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *argv] if setpriv else list(argv)


class Process:
    """A subprocess with its output in a log file, stopped by SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, *, stdin: bool = False) -> None:
        self.name = name
        self.log = log
        self._log_file = log.open("wb")
        self.popen = subprocess.Popen(
            _dying_with_parent(argv),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def check_running(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with status {code}:\n{self.tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            if self.popen.stdin is not None:
                self.popen.stdin.close()  # the guard program's cue to exit
            else:
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout)
        elif self.popen.stdin is not None:
            self.popen.stdin.close()
        self._log_file.close()


class PrometheusServer:
    """A real Prometheus in a temporary directory, scraping every second and evaluating its rules
    every second unless told otherwise, with exemplar storage on."""

    def __init__(
        self,
        workdir: Path,
        scrape_jobs: Mapping[str, str],
        rule_files: Sequence[Path],
        evaluation_interval: str = "1s",
        scrape_interval: str = "1s",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "evaluation_interval": evaluation_interval,
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [target]}]}
                for job, target in scrape_jobs.items()
            ],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.process = Process(
            "prometheus",
            [
                require_binary("prometheus"),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                # Exemplars kept and served (/api/v1/query_exemplars), as the dashboard reads them.
                "--enable-feature=exemplar-storage",
                "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )
        self.client = httpx.Client(base_url=self.url, timeout=10.0)

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool | None:
            self.process.check_running()
            return True if self.client.get("/-/ready").status_code == 200 else None

        wait_for("Prometheus to be ready", ready, timeout)

    def api(self, path: str, **params: str) -> Any:
        """GET an API path; the parsed JSON document, whatever its status."""
        return self.client.get(f"/api/v1/{path}", params=params).json()

    def query(self, expr: str) -> dict[str, Any]:
        """An instant query at the server's now: the whole answer (status, data or error)."""
        answer: dict[str, Any] = self.client.post("/api/v1/query", data={"query": expr}).json()
        return answer

    def vector(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """An instant query that must succeed: (labels, value) of each series."""
        answer = self.query(expr)
        assert answer["status"] == "success", f"{expr!r}: {answer.get('error')}"
        return [(item["metric"], float(item["value"][1])) for item in answer["data"]["result"]]

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["data"]["alerts"]
        return alerts

    def stop(self) -> None:
        self.client.close()
        self.process.stop()


def start_processor(workdir: Path) -> tuple[Process, str, str]:
    """``otel-guard processor`` on ephemeral ports: the process, its OTLP/gRPC and metrics addresses."""
    command = Path(sys.executable).with_name("otel-guard")
    if not command.exists():
        pytest.fail(f"{command} is missing: install otel-guard into the environment (scripts/bootstrap)")
    process = Process(
        "otel-guard processor",
        [str(command), "processor", "--listen", "127.0.0.1:0", "--prometheus", "127.0.0.1:0"],
        workdir / "processor.log",
    )

    def ready_line() -> str | None:
        process.check_running()
        for line in process.output().splitlines():
            if ": ready: " in line:
                return line
        return None

    try:
        line = wait_for("the processor's ready line", ready_line, timeout=30.0)
    except BaseException:
        process.stop()
        raise
    # "... ready: OTLP/gRPC on 127.0.0.1:PORT, not forwarding, metrics on 127.0.0.1:PORT/metrics"
    grpc_address = line.split("OTLP/gRPC on ", 1)[1].split(",", 1)[0]
    metrics_address = line.split("metrics on ", 1)[1].removesuffix("/metrics").strip()
    return process, grpc_address, metrics_address


@dataclass(frozen=True)
class Stack:
    """The live stack of the dashboards' end-to-end tests."""

    prometheus: PrometheusServer
    processor: Process
    processor_metrics: str  # HOST:PORT of its /metrics
    app: Process
