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
import time
from pathlib import Path
from typing import Any

import pytest
from fleet import Instance, TimedSink, collector_in_front, stream_loop_traces
from metrics_sink import MetricsSink, metrics_of, number, points
from test_collector_pipelines import received_span_ids

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

    def options(self) -> list[str]:
        return [
            "--prometheus=off",
            f"--metrics-forward={self.metrics}",
            "--metrics-interval=600",  # only the drain's push: each process's last word
            "--drain-timeout=5",
        ]

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
    statuses: list[int] = []

    async def stop_and_restart(start: float) -> None:
        await asyncio.sleep(start + STOP_AFTER - time.monotonic())
        statuses.append(await asyncio.to_thread(victim.terminate))
        await asyncio.sleep(DOWN)
        victim.start()
        await victim.ready()

    try:
        async with collector_in_front(tmp_path, instances) as port:
            sent = await stream_loop_traces(port, tick=TICK, lag=LAG, seconds=STREAM, chaos=stop_and_restart)
            # Every span the Collector took reaches a store (what waited for the victim is retried).
            deadline = time.monotonic() + WAIT
            while not set(sent.accepted) <= set().union(*(set(received_span_ids(sink)) for sink in sinks)):
                assert time.monotonic() < deadline, "spans the Collector accepted never reached a store"
                await asyncio.sleep(0.1)
            terminated = (asyncio.to_thread(instance.terminate) for instance in instances)
            statuses += await asyncio.gather(*terminated)
    finally:
        for sink in sinks:
            await sink.stop()
        await pushes.stop()
    assert sent.refused == 0  # the Collector took every request (into its queue)
    assert statuses == [0, 0, 0, 0]  # each stop a graceful drain
    counted = loops_per_process(pushes)
    per_process = list(counted.values())
    print(f"{sent.traces} loops; counted per process (the victim's first life first): {per_process}")
    assert len(counted) == 4  # three instances and the victim's second life, each pushed at its drain
    # The victim's first life counted loops, all still waiting on --count-wait when it was stopped.
    assert next(iter(counted.values())) > 0
    assert sum(counted.values()) == sent.traces  # every loop counted, once, across the fleet
