"""``--metrics-forward``: the processor pushes its own metrics over OTLP/gRPC, to a real
``MetricsService`` on 127.0.0.1, every ``--metrics-interval`` seconds and once more at the drain,
under the names and labels ``/metrics`` serves (the SDK's OTLP exporter, fed from the same registry)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from metrics_sink import MetricsSink, metrics_of, number, points
from otel_guard_processor.config import ConfigError, load_config
from processor_helpers import ProcessorFactory, Sink, export, scrape
from processor_spans import Trace, encode, guard_attributes
from test_docs import documented_metrics

GUIDE = Path(__file__).parents[2] / "docs" / "processor.md"


@pytest.fixture
async def pushes() -> AsyncIterator[MetricsSink]:
    server = MetricsSink()
    await server.start()
    yield server
    await server.stop()


def _prometheus_series(
    scraped: dict[str, dict[tuple[tuple[str, str], ...], float]],
) -> dict[str, set[tuple[str, ...]]]:
    """Per pushed metric name as Prometheus names it, the label names of its series."""
    out: dict[str, set[tuple[str, ...]]] = {}
    for sample_name, samples in scraped.items():
        if sample_name.endswith("_created"):
            continue
        name = sample_name
        for suffix in ("_bucket", "_sum", "_count"):
            if sample_name.endswith(suffix) and sample_name.removesuffix(suffix) + "_bucket" in scraped:
                name = sample_name.removesuffix(suffix)
        for labels in samples:
            out.setdefault(name, set()).add(tuple(sorted(key for key, _ in labels if key != "le")))
    return out


async def test_pushes_every_interval_with_the_names_and_labels_of_metrics(
    pushes: MetricsSink, sink: Sink, start_processor: ProcessorFactory
) -> None:
    processor = await start_processor(
        forward=sink.address, metrics_forward=pushes.address, metrics_interval=0.2
    )
    trace = Trace()
    trace.agent(
        "planner", trace.agent("budget", trace.agent("planner", attributes=guard_attributes(["planner"])))
    )
    await export(processor, encode(*trace.spans))
    await pushes.wait_for(2, timeout=10)  # a push every 0.2 s
    await processor.detection.settled()
    scraped = await scrape(processor)
    await pushes.wait_for(len(pushes.requests) + 1, timeout=10)  # a push after the scrape's counts
    pushed = metrics_of(pushes.requests[-1])
    prometheus = _prometheus_series(scraped)
    assert set(pushed) == set(prometheus)
    # Every name is one docs/processor.md lists, and labels are those of the scrape.
    assert set(pushed) <= documented_metrics(GUIDE.read_text())
    for name, metric in pushed.items():
        kind = metric.WhichOneof("data")
        assert kind == ("sum" if name.endswith("_total") else "histogram" if kind == "histogram" else "gauge")
        if kind == "sum":
            assert metric.sum.is_monotonic
            assert metric.sum.aggregation_temporality == 2
        assert {tuple(key for key, _ in labels) for labels in points(metric)} <= prometheus[name] | {()}
    cycles = points(pushed["otel_guard_cycles_total"])
    assert {key: number(point) for key, point in cycles.items()} == {
        (("cycle", "planner>budget>planner"), ("kind", "cross_function")): 1.0
    }
    spans = points(pushed["otel_guard_processor_spans_total"])
    assert (
        number(spans[(("outcome", "received"),)])
        == scraped["otel_guard_processor_spans_total"][(("outcome", "received"),)]
        == 3
    )
    resource = {
        kv.key: kv.value.string_value for kv in pushes.requests[-1].resource_metrics[0].resource.attributes
    }
    assert resource["service.name"] == "otel-guard-processor"
    assert resource["service.instance.id"]


async def test_a_push_the_downstream_cannot_take_is_logged_and_the_next_carries_the_counts(
    start_processor: ProcessorFactory, pushes: MetricsSink, caplog: pytest.LogCaptureFixture
) -> None:
    address = pushes.address
    await pushes.stop()  # nobody listens there yet
    processor = await start_processor(metrics_forward=address, metrics_interval=0.2)
    trace = Trace()
    trace.agent("planner", trace.agent("planner"))
    await export(processor, encode(*trace.spans))
    assert processor.push is not None
    assert not await processor.push.push()
    assert "pushing its metrics to" in caplog.text
    restarted = MetricsSink()
    await restarted.start(int(address.rsplit(":", 1)[1]))
    try:
        await restarted.wait_for(1, timeout=15)
        cycles = points(metrics_of(restarted.requests[-1])["otel_guard_cycles_total"])
        assert [number(point) for point in cycles.values()] == [1.0]
    finally:
        await restarted.stop()


def test_metrics_forward_options() -> None:
    config = load_config({}, environ={})
    assert (config.metrics_forward, config.metrics_interval) == (None, 15.0)
    config = load_config({"metrics_forward": "127.0.0.1:4317"},
                         environ={"OTEL_GUARD_PROCESSOR_METRICS_INTERVAL": "5"})  # fmt: skip
    assert (config.metrics_forward, config.metrics_interval) == ("127.0.0.1:4317", 5.0)
    with pytest.raises(ConfigError, match=r"metrics_interval \(from flag --metrics-interval\)"):
        load_config({"metrics_interval": "0"}, environ={})
    with pytest.raises(ConfigError, match="metrics_forward"):
        load_config({"metrics_forward": "nowhere"}, environ={})


def test_an_exemplar_carries_a_chain_root_only_within_openmetrics_128_characters() -> None:
    from otel_guard_processor.metrics import exemplar

    at = (b"\x01" * 16, b"\x02" * 8, 1.0)
    fits, too_long = "r" * 55, "r" * 56  # the ids and their names take 63 of the 128
    assert exemplar(at, fits).labels["chain_root"] == fits  # type: ignore[union-attr]
    made = exemplar(at, too_long)
    assert made is not None
    assert "chain_root" not in made.labels
    assert sum(len(key) + len(value) for key, value in exemplar(at, fits).labels.items()) == 128  # type: ignore[union-attr]
