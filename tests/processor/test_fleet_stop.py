"""A graceful stop loses no count (issue 42): SIGTERM makes every count still waiting, and the last
scrape and the last push read them.

The real command, the default ``--count-wait`` (10 s): 40 loops sent over gRPC, half of them in
traces whose top span has not come yet (exporters send a span as it ends, children first), and
SIGTERM right after the last acknowledgement. Before, the loops whose spans waited for their
parent were never counted (20 of 40 here), and ``/metrics`` closed about 0.1 s after the drain's
log lines, before a scrape could read the others.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from typing import Any

import grpc.aio
import httpx
import pytest
from metrics_sink import MetricsSink, metrics_of, number, points
from processor_helpers import EXPORT, processor_process, ready_port
from processor_spans import Trace, encode, guard_attributes
from prometheus_client.openmetrics.parser import text_string_to_metric_families

LOOPS = 40
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _loop(n: int) -> tuple[bytes, str, str | None]:
    """Loop ``n``: ``p{n}`` runs ``b{n}``, which runs ``p{n}`` again, under a ``top{n}`` agent; its
    request, label and chain root. Odd loops are the guard's spans (each names its chain root);
    loops n % 4 < 2 leave the top span out, so that the loop's spans wait for their parent."""
    trace = Trace()
    root = f"{n:032x}" if n % 2 else None
    names = [f"top{n}", f"p{n}", f"b{n}", f"p{n}"]
    parent = None
    for depth, name in enumerate(names):
        attributes = guard_attributes(names[: depth + 1], root=root) if root else None
        parent = trace.agent(name, parent, attributes=attributes)
    spans = trace.spans[1:] if n % 4 < 2 else trace.spans
    return encode(*spans), f"p{n}>b{n}>p{n}", root


def _loop_lines(stderr: str) -> dict[str, dict[str, Any]]:
    lines = {}
    for line in stderr.splitlines():
        if "loop counted" in line:
            fields = json.loads(line)
            lines[fields["cycle"]] = fields
    return lines


async def _scrape(port: int) -> dict[str, tuple[float, dict[str, str] | None]]:
    """``otel_guard_cycles_total`` by cycle label: its value and its exemplar's labels."""
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics", headers={"Accept": OPENMETRICS})
    response.raise_for_status()
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "otel_guard_cycles_total":
                exemplar = dict(sample.exemplar.labels) if sample.exemplar else None
                found[sample.labels["cycle"]] = (sample.value, exemplar)
    return found


@pytest.mark.integration
async def test_sigterm_right_after_the_last_ack_counts_every_loop_in_log_scrape_and_push() -> None:
    loops = [_loop(n) for n in range(LOOPS)]
    roots = {label: root for _, label, root in loops}
    pushes = MetricsSink()
    await pushes.start()
    args = ("--prometheus", "127.0.0.1:0", "--log-format", "json", "--metrics-forward", pushes.address,
            "--metrics-interval", "600", "--metrics-grace", "10")  # fmt: skip
    try:
        with processor_process(*args) as (process, ready):
            assert "count" not in " ".join(process.args)  # the default --count-wait, 10 s
            grpc_port = ready_port(ready, "ready: OTLP/gRPC")
            metrics_port = ready_port(ready, "metrics")
            assert await _scrape(metrics_port) == {}  # scraped once: a scraper is there
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                send = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
                for raw, _, _ in loops:
                    assert await send(raw, timeout=10) == b""
            process.send_signal(signal.SIGTERM)  # every count still waits on --count-wait
            signalled = time.monotonic()
            assert process.stderr is not None
            stderr = ""
            while len(_loop_lines(stderr)) < LOOPS:  # the drain's log lines
                line = await asyncio.wait_for(asyncio.to_thread(process.stderr.readline), 10)
                assert line, f"the processor ended after {len(_loop_lines(stderr))} loop lines:\n{stderr}"
                stderr += line
            scraped = await _scrape(metrics_port)  # the last scrape, after the drain's counts
            assert await asyncio.to_thread(process.wait, 10) == 0
            stderr += process.stderr.read()
            stopped = time.monotonic() - signalled
    finally:
        await pushes.stop()
    labels = {label for _, label, _ in loops}
    lines = _loop_lines(stderr)
    assert set(lines) == labels
    for label, line in lines.items():
        assert line.get("chain_root") == roots[label], line
        assert line["suppressed"] == 0
    assert {label: value for label, (value, _) in scraped.items()} == dict.fromkeys(labels, 1.0)
    for label, (_, exemplar) in scraped.items():
        assert exemplar is not None
        assert re.fullmatch("[0-9a-f]{32}", exemplar["trace_id"])
        assert exemplar.get("chain_root") == roots[label], (label, exemplar)
    # The /metrics endpoint closed once the last scrape read the counts, not at the end of the grace.
    assert stopped < 8, stopped
    # And the push at the drain carried the same counts.
    assert len(pushes.requests) == 1  # the interval is 600 s: this is the drain's push
    cycles = points(metrics_of(pushes.requests[-1])["otel_guard_cycles_total"])
    assert {dict(key)["cycle"]: number(point) for key, point in cycles.items()} == dict.fromkeys(labels, 1.0)
    for key, point in cycles.items():
        (exemplar,) = point.exemplars
        assert len(exemplar.trace_id) == 16
        assert len(exemplar.span_id) == 8
        attributes = {kv.key: kv.value.string_value for kv in exemplar.filtered_attributes}
        assert attributes.get("chain_root") == roots[dict(key)["cycle"]]
