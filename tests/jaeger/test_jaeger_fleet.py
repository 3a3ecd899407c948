"""The fleet's shape with a real trace store: the Collector's loadbalancing exporter (``scaleout.yaml``
as shipped, trace id routing, down to two instances) in front of two ``otel-guard processor``
processes, both forwarding to one Jaeger.

Loops recorded by the inline guard go in through the Collector. Every span reaches Jaeger once, each
loop is counted once across the two processors, and each processor's cycle exemplar -- the latest
loop it counted -- opens in Jaeger a trace the app sent, whose span ``span_id`` names is the refused
return and whose spans carry the exemplar's ``chain_root``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from guarded_loops import Processor, chain_root, cycle_exemplars, loop_in_one_trace, send, spans_of
from jaeger_store import WAIT, JaegerStore, attributes
from test_collector_configs import collector
from test_collector_pipelines import config_for_test, free_port, wait_for_port

import otel_guard

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOOPS = 16  # the chance that the balancer sends them all to one instance: 2 in 65,536
SERIES = (("cycle", "planner>budget>planner"), ("kind", "cross_function"))


def two_instance_config(tmp_path: Path, port: int, instances: list[Processor]) -> Path:
    """``scaleout.yaml`` with the test's addresses, its static ring cut to the two instances."""
    hosts = {f"otel-guard-processor-{n}:4317": instance.address for n, instance in enumerate(instances)}
    path = config_for_test(tmp_path, "scaleout", port, free_port(), hosts)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    resolver = config["exporters"]["loadbalancing"]["resolver"]["static"]
    resolver["hostnames"] = [instance.address for instance in instances]
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


async def test_two_processors_behind_the_collector_both_forward_to_jaeger(
    tmp_path: Path, spans: Any, jaeger: JaegerStore
) -> None:
    otel_guard.configure(mode="enforce", cycle_rule="agent")
    loops = [loop_in_one_trace(spans)[0] for _ in range(LOOPS)]
    roots = {spans_of(raw)[0].trace_id.hex(): chain_root(raw) for raw in loops}
    instances = [Processor(tmp_path, n, jaeger.otlp) for n in range(2)]
    process: subprocess.Popen[str] | None = None
    try:
        for instance in instances:
            instance.start()
        for instance in instances:
            await instance.ready()
        port = free_port()
        config = two_instance_config(tmp_path, port, instances)
        with (tmp_path / "collector.log").open("w") as log:
            process = subprocess.Popen(
                [collector(), f"--config={config}"], stdout=subprocess.DEVNULL, stderr=log, text=True
            )
        await wait_for_port(port, process)
        await send(f"127.0.0.1:{port}", loops)
        stored = {trace_id: await jaeger.wait_for_spans(trace_id, 3) for trace_id in roots}
        deadline = time.monotonic() + WAIT
        while True:
            counted = [await instance.scrape() for instance in instances]
            # after the counts: an instance counted there has its exemplar here
            scraped = [await cycle_exemplars(instance.metrics_port) for instance in instances]
            total = sum(
                value for samples in counted for value in samples.get("otel_guard_cycles_total", {}).values()
            )
            if total >= LOOPS or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        again = {trace_id: await jaeger.trace_spans(trace_id) for trace_id in roots}
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for instance in instances:
            instance.stop()

    assert [instance.status for instance in instances] == [0, 0]  # graceful stops
    assert process is not None
    assert process.returncode == 0
    # Every span of every loop in Jaeger, once (nothing more came while the counts settled).
    for trace_id, raw in zip(roots, loops, strict=True):
        assert sorted(span["spanId"] for span in stored[trace_id]) == sorted(
            s.span_id.hex() for s in spans_of(raw)
        )
        assert len(again[trace_id]) == 3
    # Each loop counted once across the fleet, and both instances had some (trace id routing).
    per_instance = [sum(samples.get("otel_guard_cycles_total", {}).values()) for samples in counted]
    assert sum(per_instance) == LOOPS
    assert all(per_instance), per_instance
    # Each instance's exemplar opens, in the one Jaeger, a loop the app sent, at its refused return.
    seen = set()
    for exemplars in scraped:
        exemplar = exemplars[SERIES]
        assert exemplar is not None
        assert exemplar["trace_id"] in roots
        assert exemplar["chain_root"] == roots[exemplar["trace_id"]]
        returned = {span["spanId"]: span for span in stored[exemplar["trace_id"]]}[exemplar["span_id"]]
        hop = attributes(returned["attributes"])
        assert hop["otel_guard.decision"] == "refuse"
        assert hop["otel_guard.chain.root"] == exemplar["chain_root"]
        seen.add(exemplar["trace_id"])
    assert len(seen) == 2  # two instances, two loops: each exemplar its own instance's
