"""A fleet stopped and restarted behind the real Collector loses no loop count (issue 42).

Three ``otel-guard processor`` processes behind the Collector's loadbalancing exporter
(``scaleout.yaml`` as shipped: trace id routing, static resolver, sending queue and retry), each
with the default ``--count-wait`` (10 s) and pushing its own metrics over OTLP
(``--metrics-forward``) to a real ``MetricsService`` here. A steady stream of loop traces, each sent
in two requests 2.5 s apart; one instance is stopped with SIGTERM mid-stream and started again on
the same port a few seconds later; at the end the whole fleet is stopped with SIGTERM. Every loop
is counted exactly once across the fleet, read from each process's last push (the one its drain
makes): the stopped instance's drain made the counts still waiting on ``--count-wait``, and a trace
split across the restart is counted by the restarted instance (its repeat settles on the chain it
carries when that instance drains). Before issue 42 the counts waiting at SIGTERM, and those of
spans waiting for their parent, were lost.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc.aio
import pytest
from metrics_sink import MetricsSink, metrics_of, number, points
from processor_helpers import EXPORT
from test_collector_configs import collector
from test_collector_pipelines import config_for_test, free_port, received_span_ids, wait_for_port
from test_collector_scaleout import Instance, TimedSink, loop_trace_in_two, request_spans

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TICK = 0.05  # a trace every 50 ms, its two requests LAG ticks (2.5 s) apart
LAG = 50
STREAM = 7.0  # seconds of traces
STOP_AFTER = 5.0  # the victim is stopped (SIGTERM) this far into the stream: its loops wait on --count-wait
DOWN = 2.0  # and started again this long after it exited
WAIT = 30.0


class PushingInstance(Instance):
    """An instance with the default ``--count-wait``, pushing its metrics to ``metrics``."""

    def __init__(self, tmp_path: Path, index: int, forward: str, metrics: str) -> None:
        super().__init__(tmp_path, index, forward)
        self.metrics = metrics

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "otel_guard_processor",
            f"--listen={self.address}",
            f"--forward={self.forward}",
            "--prometheus=off",
            f"--metrics-forward={self.metrics}",
            "--metrics-interval=600",  # only the drain's push: each process's last word
            "--drain-timeout=5",
            "--log-level=warning",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)

    def terminate(self) -> int:
        """SIGTERM, and its exit status once it drained."""
        assert self.process is not None
        self.process.terminate()
        return self.process.wait(WAIT)


def loops_per_process(pushes: MetricsSink) -> dict[str, float]:
    """Per process (its ``service.instance.id``), the loops its last push counted, in the order of
    their first push (the first is the victim's first life: the others push at the end)."""
    last: dict[str, Any] = {}
    for request in pushes.requests:
        resource = {kv.key: kv.value.string_value for kv in request.resource_metrics[0].resource.attributes}
        last[resource["service.instance.id"]] = request
    counted: dict[str, float] = {}
    for instance_id, request in last.items():
        cycles = metrics_of(request).get("otel_guard_cycles_total")
        counted[instance_id] = sum(number(point) for point in points(cycles).values()) if cycles else 0.0
    return counted


async def test_a_fleet_stopped_and_restarted_counts_every_loop_once(tmp_path: Path) -> None:
    pushes = MetricsSink()
    await pushes.start()
    sinks = [TimedSink(), TimedSink(), TimedSink()]
    for sink in sinks:
        await sink.start()
    instances = [PushingInstance(tmp_path, n, sink.address, pushes.address) for n, sink in enumerate(sinks)]
    victim = instances[1]
    process: subprocess.Popen[str] | None = None
    statuses: list[int] = []

    async def stop_and_restart(start: float) -> None:
        await asyncio.sleep(start + STOP_AFTER - time.monotonic())
        statuses.append(await asyncio.to_thread(victim.terminate))
        await asyncio.sleep(DOWN)
        victim.start()
        await victim.ready()

    try:
        for instance in instances:
            instance.start()
        for instance in instances:
            await instance.ready()
        port, http_port = free_port(), free_port()
        hosts = {f"otel-guard-processor-{n}:4317": i.address for n, i in enumerate(instances)}
        config = config_for_test(tmp_path, "scaleout", port, http_port, hosts)
        with (tmp_path / "collector.log").open("w") as log:
            process = subprocess.Popen(
                [collector(), f"--config={config}"], stdout=subprocess.DEVNULL, stderr=log, text=True
            )
        await wait_for_port(port, process)
        accepted: set[bytes] = set()
        traces = 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            send = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            later: list[bytes] = []
            start = time.monotonic()
            chaos = asyncio.ensure_future(stop_and_restart(start))
            tick = 0
            while True:
                batch: list[bytes] = []
                if time.monotonic() - start < STREAM:
                    first, second = loop_trace_in_two()
                    traces += 1
                    batch.append(first)
                    later.append(second)
                if len(later) > LAG or (time.monotonic() - start >= STREAM and later):
                    batch.append(later.pop(0))
                if not batch:
                    break
                for raw in batch:
                    await send(raw, timeout=10)
                    accepted.update(span.span_id for span in request_spans(raw))
                tick += 1
                await asyncio.sleep(max(0.0, start + tick * TICK - time.monotonic()))
            await chaos
        # Every span the Collector took reaches a store (what waited for the victim is retried).
        deadline = time.monotonic() + WAIT
        while not accepted <= set().union(*(set(received_span_ids(sink)) for sink in sinks)):
            assert time.monotonic() < deadline, "spans the Collector accepted never reached a store"
            await asyncio.sleep(0.1)
        statuses += await asyncio.gather(*(asyncio.to_thread(instance.terminate) for instance in instances))
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for instance in instances:
            instance.stop()
        for sink in sinks:
            await sink.stop()
        await pushes.stop()
    assert statuses == [0, 0, 0, 0]  # each stop a graceful drain
    counted = loops_per_process(pushes)
    print(f"{traces} loops; counted per process (the victim's first life first): {list(counted.values())}")
    assert len(counted) == 4  # three instances and the victim's second life, each pushed at its drain
    # The victim's first life counted loops, all still waiting on --count-wait when it was stopped.
    assert next(iter(counted.values())) > 0
    assert sum(counted.values()) == traces  # every loop counted, once, across the fleet
