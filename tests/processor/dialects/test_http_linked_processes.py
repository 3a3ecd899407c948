"""A loop between two agent processes whose only link is HTTP client and server spans.

No chain, no otel-guard in either process: planner and budget each run pydantic-ai (its own
instrumentation) behind an HTTP endpoint and ask each other over httpx; OpenTelemetry's httpx and
ASGI instrumentations carry the trace context. Both export to one ``otel-guard processor``
(started as its command), which must count the bounce as one ``cross_function`` cycle.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from dialect_runs import dialects_python
from processor_helpers import processor_process, ready_port
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = Path(__file__).with_name("http_agent_app.py")
WAIT_SECONDS = 30.0


@contextmanager
def agent_process(name: str, peer: str, max_tool_calls: int, folder: Path, endpoint: str) -> Iterator[Path]:
    """Start one agent's process; yield its port file once it serves; stop it afterwards."""
    port_file, peer_file, log = folder / f"{name}.port", folder / f"{peer}.port", folder / f"{name}.err"
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, PYTHONPATH="")
    with log.open("wb") as stderr:
        command = [dialects_python(), str(APP), name, str(peer_file), str(max_tool_calls)]
        process = subprocess.Popen([*command, "--port-file", str(port_file)], env=env, stderr=stderr)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not port_file.exists():
            assert process.poll() is None, f"{name} exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"{name} did not start: {log.read_text()}"
            time.sleep(0.05)
        yield port_file
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def metric(metrics_url: str, name: str) -> dict[tuple[str, ...], float]:
    """One metric's non-zero samples from /metrics, by label values in label-name order."""
    text = httpx.get(metrics_url, timeout=10).text
    found: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.value:
                found[tuple(v for _, v in sorted(sample.labels.items()))] = sample.value
    return found


def test_a_loop_across_two_processes_linked_only_by_http_is_one_cross_function_cycle(tmp_path: Path) -> None:
    with ExitStack() as stack:
        _, ready = stack.enter_context(processor_process("--prometheus", "127.0.0.1:0"))
        endpoint = f"http://127.0.0.1:{ready_port(ready, 'ready: OTLP/gRPC')}"
        metrics_url = f"http://127.0.0.1:{ready_port(ready, 'metrics')}/metrics"
        # planner asks budget 3 times, budget asks planner twice: 5 calls over HTTP, then answers.
        planner = stack.enter_context(agent_process("planner", "budget", 3, tmp_path, endpoint))
        stack.enter_context(agent_process("budget", "planner", 2, tmp_path, endpoint))
        answer = httpx.post(
            f"http://127.0.0.1:{planner.read_text()}/ask", json={"question": "Plan the offsite"}, timeout=60
        )
        assert answer.status_code == 200, answer.text
        # The loop's count waits --count-wait (10 s by default) for the two processes' late spans.
        deadline = time.monotonic() + WAIT_SECONDS
        while sum(metric(metrics_url, "otel_guard_delegations_total").values()) < 5 or not metric(
            metrics_url, "otel_guard_cycles_total"
        ):
            assert time.monotonic() < deadline, metric(metrics_url, "otel_guard_delegations_total")
            time.sleep(0.1)
        assert metric(metrics_url, "otel_guard_cycles_total") == {
            ("planner>budget>planner", "cross_function"): 1
        }
        assert metric(metrics_url, "otel_guard_delegations_total") == {
            ("budget", "planner"): 3,
            ("planner", "budget"): 2,
        }
