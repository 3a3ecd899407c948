"""The metrics' part of the worst case, measured at its cap: every label family a sender's names
label holds its 10,000 label sets of the longest labels, and scrapes render them.

docs/processor.md (*Memory*) bounds this part at 192 MiB (four families, labels of 4-byte
characters, 4 KiB a cycle label, the cycle edges remade beside the last ones, and the scrape).
``test_worst_case_rss.py`` runs this attack beside the others for 10 s, which does not reach the
cap; here it runs to the cap alone, in a processor of its own, and the resident growth is read
from ``/proc`` (178-180 MiB measured; the first bound, 136 MiB, missed the cycle edges). What a
reader would not guess: the growth is read against a processor that already counted a loop and
served a scrape of each format, so the libraries those load are not counted as the metrics' part.
"""

from __future__ import annotations

import asyncio
import threading
import time

import grpc.aio
import httpx
import pytest
from otel_guard_processor.bounds import MAX_SERIES
from processor_helpers import EXPORT, processor_process, ready_port
from prometheus_client.parser import text_string_to_metric_families
from test_worst_case_rss import METRICS, Resident, long_labels, resident_mib

LOOPS = 12_000  # past the cap of every family: each loop is one cycle, two delegations, two edges
PER_REQUEST = 250
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
FAMILIES = (
    "otel_guard_cycles",
    "otel_guard_delegations",
    "otel_guard_cycle_edges",
    "otel_guard_span_decisions",
)


def counted(body: str) -> dict[str, tuple[int, float, float]]:
    """Per family: the series shown, their total, and the part counted under ``_overflow``."""
    out: dict[str, tuple[int, float, float]] = {}
    for family in text_string_to_metric_families(body):
        if family.name in FAMILIES:
            samples = [sample for sample in family.samples if not sample.name.endswith("_created")]
            overflow = sum(s.value for s in samples if "_overflow" in s.labels.values())
            out[family.name] = (len(samples), sum(s.value for s in samples), overflow)
    return out


@pytest.mark.integration
@pytest.mark.slow
async def test_four_families_at_their_cap_stay_within_the_metrics_part_of_the_worst_case() -> None:
    with processor_process("--prometheus", "127.0.0.1:0", "--count-wait", "0", "--max-traces", "1000") as (
        process,
        ready,
    ):
        assert process.stderr is not None
        # A loop's log line is a warning of about 2 KiB here: read them all, or the pipe fills and
        # the processor waits on its own log.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        grpc_port, metrics_url = (
            ready_port(ready, "OTLP/gRPC"),
            f"http://127.0.0.1:{ready_port(ready, 'metrics')}/metrics",
        )
        requests = [long_labels(first, PER_REQUEST) for first in range(0, LOOPS, PER_REQUEST)]
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
            httpx.AsyncClient(timeout=30) as client,
        ):
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            await call(requests[0], timeout=10)  # warm: one request's loops counted, both formats rendered
            for accept in (OPENMETRICS, ""):
                (await client.get(metrics_url, headers={"Accept": accept})).raise_for_status()
            warm = resident_mib(process.pid)
            with Resident(process.pid) as resident:
                for raw in requests[1:]:
                    await call(raw, timeout=10)
                deadline = time.monotonic() + 30
                while True:  # every loop counted (--count-wait 0: in the request that makes it due)
                    body = (await client.get(metrics_url)).text
                    if counted(body).get("otel_guard_cycles", (0, 0.0, 0.0))[1] >= LOOPS:
                        break
                    assert time.monotonic() < deadline, counted(body)
                    await asyncio.sleep(0.2)
                sizes = []
                for accept in (OPENMETRICS, "", OPENMETRICS, ""):
                    response = await client.get(metrics_url, headers={"Accept": accept})
                    response.raise_for_status()
                    sizes.append(len(response.content))
                await asyncio.sleep(0.2)
            grown = resident.peak_main - warm
        print(
            f"warm {warm:.0f} MiB, peak {resident.peak_main:.0f} MiB: {grown:.0f} MiB grown; scrapes {sizes}"
        )
        families = counted(body)
        for name in FAMILIES:
            shown, total, overflow = families[name]
            assert 1 < shown < MAX_SERIES, name  # /metrics shows what fits its bytes, not the whole cap
            assert overflow > 0, name  # the family reached its cap: what is past it is counted, not kept
            assert total >= LOOPS, name  # nothing lost
        assert grown <= METRICS, grown
