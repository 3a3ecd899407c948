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
import threading
import time
from collections.abc import Awaitable, Callable

import grpc
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
from prometheus_client.registry import CollectorRegistry

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


class Probe:
    """A grpcio client on a thread of its own sending a small request every 10 ms and timing each
    answer: it sees the processor's event loop held, as another process's client would. It is
    stopped off the event loop: joined on the loop, a call in flight waits for a loop held by the
    join until its deadline."""

    def __init__(self, processor: Processor) -> None:
        trace = Trace()
        trace.tool("lookup", trace.agent("probe"))
        self._raw = encode(*trace.spans)
        self._address = grpc_address(processor)
        self._stop = threading.Event()
        self.latencies: list[float] = []
        self.failures: list[grpc.RpcError] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def __aenter__(self) -> Probe:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 15)

    def _run(self) -> None:
        with grpc.insecure_channel(self._address) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    call(self._raw, timeout=5)
                except grpc.RpcError as exc:
                    self.failures.append(exc)
                self.latencies.append(time.perf_counter() - started)
                self._stop.wait(0.01)


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
    seconds = []
    async with Probe(processor) as probe:
        await asyncio.sleep(0.1)
        for accept in (OPENMETRICS, "", OPENMETRICS, ""):
            body, took = await scrape(processor, accept)
            seconds.append(took)
            assert len(body) <= SCRAPE_BYTES, (accept, len(body))  # before: 27 MiB
        await asyncio.sleep(0.05)
    assert len(probe.latencies) > 5
    assert not probe.failures
    assert max(probe.latencies) < PROBE_SECONDS, (max(probe.latencies), seconds)
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


async def rendered(
    encode: Callable[[CollectorRegistry], bytes | Awaitable[bytes]], registry: CollectorRegistry
) -> bytes:
    body = encode(registry)
    return await body if isinstance(body, Awaitable) else body


async def test_a_scrape_is_what_prometheus_client_makes_of_the_metrics_kept_between_scrapes() -> None:
    detector = EngineDetector()
    stats = RequestStats()
    registry = new_registry(detector, stats)
    for raw in loops(0, 3, per_request=1):
        detector.ingest(raw, time.time())
    detector.expire(time.time() + 60)  # the counts waiting on count_wait made
    assert detector.cycles
    # Label values prometheus_client escapes, and an exemplar-less series.
    detector.delegations[("a\\b", 'c"d\ne')] = 2
    detector.decisions[("allow", "", "x" * 300)] = 1
    stats.request("grpc", "ok", 100, 0.003)
    for accept in ("", OPENMETRICS, "text/plain; version=1.0.0; escaping=allow-utf-8"):
        ours, content_type = choose_encoder(accept)
        theirs, their_type = exposition.choose_encoder(accept)
        assert content_type == their_type
        assert await rendered(ours, registry) == theirs(registry)
        assert await rendered(ours, registry) == theirs(registry)  # kept, and still the same
        detector.ingest(loops(10, 1)[0], time.time())
        stats.spans["received"] += 3
        stats.request("http", "ok", 100, 0.2)
        detector.expire(time.time() + 60)
        assert await rendered(ours, registry) == theirs(registry)  # changed, made again


async def test_a_scrape_renders_a_copy_made_in_the_detection_queue(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    encode, _ = choose_encoder("")
    body = encode(processor.registry)
    assert isinstance(body, Awaitable)  # rendered off the event loop, of the tallies copied now
    processor.stats.spans["received"] += 7  # a change after the copy is not in it
    text = (await body).decode()
    assert 'otel_guard_processor_spans_total{outcome="received"} 0.0' in text
