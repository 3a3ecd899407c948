"""The metric names and labels the dashboards may read, taken from the real producers in process.

- The inline guard's OpenTelemetry metrics, as the OpenTelemetry Prometheus exporter serves them (a
  private registry, a private MeterProvider: the session's global providers are left alone).
- The processor's metric families, from its own collector.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from otel_guard_processor.engine import EngineDetector
from otel_guard_processor.metrics import RequestStats, new_registry
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import otel_guard
from otel_guard import DelegationRefused, delegate, telemetry
from otel_guard.usage import ModelUsage, after_model_request

SAMPLE_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


@contextmanager
def guard_metrics_registry() -> Iterator[CollectorRegistry]:
    """A registry serving the guard's metrics through the OpenTelemetry Prometheus exporter."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        with telemetry.bound(TracerProvider(), provider):
            yield registry
    finally:
        provider.shutdown()


def guard_samples() -> dict[str, set[frozenset[tuple[str, str]]]]:
    """Sample name -> label sets the guard's metrics have after hops of every kind of decision, a
    budget check whose store could not be reached, and a priced and an unpriced model response.

    The settings and budget stores it changes are the session's; the suite's autouse fixture
    (tests/conftest.py) resets both after each test."""
    with guard_metrics_registry() as registry:
        otel_guard.configure(mode="observe", cycle_rule="agent")
        with delegate("planner"), delegate("budget"), delegate("planner"):
            pass  # would_refuse: a cycle
        with delegate("lookup", kind="tool"):
            pass
        otel_guard.configure(mode="enforce")
        try:
            with delegate("summarize"), delegate("summarize"):
                pass
        except DelegationRefused:
            pass  # refuse: a cycle
        otel_guard.configure(mode="observe", max_hops=1)
        with delegate("dispatcher"), delegate("researcher"):
            pass  # would_refuse: the tree's budget
        otel_guard.configure(mode="enforce")
        try:
            with delegate("intake"), delegate("triage"):
                pass
        except DelegationRefused:
            pass  # refuse: the tree's budget
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # bound, not listening: every connection is refused
            store = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
            otel_guard.configure(max_hops=1000, budget_store=store, budget_on_error="allow")
            with delegate("ledger"):
                pass  # a budget store error; the hop runs
        otel_guard.configure(
            max_hops=0, budget_store="memory", max_cost="1", prices={"priced": {"input": 1, "output": 1}}
        )
        with delegate("concierge"):
            after_model_request(ModelUsage("priced", 1000, 0))  # spend
            after_model_request(ModelUsage("homegrown", 1000, 0))  # unpriced
        text = generate_latest(registry).decode()
    samples: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset((k, v) for k, v in sample.labels.items() if v != "")
            samples.setdefault(sample.name, set()).add(labels)
    return samples


def processor_metric_names() -> set[str]:
    """Every sample name the processor's /metrics can serve."""
    text = generate_latest(new_registry(EngineDetector(), RequestStats())).decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type])
    return names
