"""``/metrics`` is bounded in bytes: the longest labels senders can choose make a scrape of a few MiB.

The attack (issue 41): loops between agents whose names are as long as the processor keeps (256
characters, each 4 bytes in UTF-8), each a new series of every metric a sender's names label --
cycles, delegations, cycle edges and decisions. Before, 10,000 of them per metric made a 111 MiB
scrape that held the event loop 0.8 s (the receivers' too) and took the RSS to 1.3 GiB; here 2,000
made 18 MiB. Now each of those metrics shows at most ``MAX_FAMILY_BYTES`` of series and counts the
rest under ``_overflow``.
"""

from __future__ import annotations

import asyncio
import time

import grpc.aio
import httpx
from otel_guard_processor.bounds import OVERFLOW
from otel_guard_processor.engine import EngineDetector
from otel_guard_processor.metrics import MAX_FAMILY_BYTES, RequestStats, choose_encoder, new_registry
from otel_guard_processor.service import Processor
from processor_helpers import EXPORT, ProcessorFactory, grpc_address
from processor_spans import Trace, encode, guard_attributes
from prometheus_client import exposition
from prometheus_client.parser import text_string_to_metric_families

WIDE = "\U0001d538"  # four bytes in UTF-8
OPENMETRICS = "application/openmetrics-text; version=1.0.0"
LARGE = ("otel_guard_cycles", "otel_guard_delegations", "otel_guard_cycle_edges", "otel_guard_span_decisions")
SCRAPE_BYTES = 4 * MAX_FAMILY_BYTES + 64 * 1024  # the four, and the rest of the metrics
PROBE_SECONDS = 0.25  # before: 0.67 s and more


def loops(first: int, count: int, per_request: int = 250) -> list[bytes]:
    """``count`` loops a → b → a, each between two new agents of the longest names, each hop
    refused by the guard for a reason of the longest length: requests of ``per_request`` loops."""
    requests = []
    for start in range(first, first + count, per_request):
        spans = []
        for n in range(start, min(start + per_request, first + count)):
            trace = Trace()
            a, b = f"a{n}-".ljust(256, WIDE), f"b{n}-".ljust(256, WIDE)
            refused = guard_attributes([a], decision="refuse", reason=f"r{n}-".ljust(256, WIDE))
            first_a = trace.agent(a, attributes=refused)
            trace.agent(a, trace.agent(b, first_a))
            spans.extend(trace.spans)
        requests.append(encode(*spans))
    return requests


async def scrape(processor: Processor, accept: str) -> tuple[bytes, float]:
    assert processor.prometheus is not None
    async with httpx.AsyncClient() as client:
        started = time.perf_counter()
        response = await client.get(
            f"http://127.0.0.1:{processor.prometheus.port}/metrics", headers={"Accept": accept}
        )
        response.raise_for_status()
        return response.content, time.perf_counter() - started


def totals(body: bytes) -> dict[str, dict[tuple[str, ...], float]]:
    """Per large metric: its series (label values in label-name order) and their values."""
    out: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in LARGE}
    for family in text_string_to_metric_families(body.decode()):
        if family.name in out:
            for sample in family.samples:
                key = tuple(value for _, value in sorted(sample.labels.items()))
                out[family.name][key] = sample.value
    return out


async def probe(processor: Processor, stop: asyncio.Event, latencies: list[float]) -> None:
    """A grpcio client sending a small request every 10 ms, timing each answer."""
    trace = Trace()
    trace.tool("lookup", trace.agent("probe"))
    raw = encode(*trace.spans)
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        while not stop.is_set():
            started = time.perf_counter()
            await call(raw, timeout=10)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)


async def test_the_longest_labels_make_a_scrape_of_a_few_mib_and_the_rest_is_counted_under_overflow(
    start_processor: ProcessorFactory,
) -> None:
    processor = await start_processor()
    sent = 2000
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for raw in loops(0, sent):
            await call(raw, timeout=10)
    await processor.detection.settled()
    stop, latencies = asyncio.Event(), []
    probing = asyncio.ensure_future(probe(processor, stop, latencies))
    await asyncio.sleep(0.1)
    seconds = []
    try:
        for accept in (OPENMETRICS, "", OPENMETRICS, ""):
            body, took = await scrape(processor, accept)
            seconds.append(took)
            assert len(body) <= SCRAPE_BYTES, (accept, len(body))  # before: 18 MiB
    finally:
        stop.set()
        await probing
    assert max(latencies) < PROBE_SECONDS, (max(latencies), seconds)
    first = totals((await scrape(processor, ""))[0])
    # Every loop counted, those past the bound under _overflow.
    expected = {"otel_guard_cycles": sent, "otel_guard_delegations": 2 * sent + 1,  # the probe's too
                "otel_guard_cycle_edges": 2 * sent, "otel_guard_span_decisions": sent}  # fmt: skip
    for name in LARGE:
        shown = first[name]
        assert sum(shown.values()) == expected[name], name
        overflow = next(
            value for labels, value in shown.items() if set(labels) <= {OVERFLOW, "cross_function"}
        )
        assert 0 < overflow < expected[name], name
        assert 50 < len(shown) < sent, name
    # More loops: every series shown stays shown and only grows; the new ones go under _overflow.
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for raw in loops(sent, 250):
            await call(raw, timeout=10)
    assert len((await scrape(processor, OPENMETRICS))[0]) <= SCRAPE_BYTES
    second = totals((await scrape(processor, ""))[0])
    for name in LARGE:
        for labels, value in first[name].items():
            assert second[name][labels] >= value, (name, labels[:1])
        assert set(second[name]) == set(first[name])


def test_a_scrape_is_what_prometheus_client_makes_of_the_metrics_kept_between_scrapes() -> None:
    detector = EngineDetector()
    stats = RequestStats()
    registry = new_registry(detector, stats)
    for raw in loops(0, 3, per_request=1):
        detector.ingest(raw, time.time())
    detector.expire(time.time() + 60)  # the counts waiting on count_wait made
    assert detector.cycles
    for accept in ("", OPENMETRICS, "text/plain; version=1.0.0"):
        ours, content_type = choose_encoder(accept)
        theirs, their_type = exposition.choose_encoder(accept)
        assert content_type == their_type
        assert ours(registry) == theirs(registry)
        assert ours(registry) == theirs(registry)  # kept, and still the same
        detector.ingest(loops(10, 1)[0], time.time())
        stats.spans["received"] += 3
        detector.expire(time.time() + 60)
        assert ours(registry) == theirs(registry)  # changed, made again
