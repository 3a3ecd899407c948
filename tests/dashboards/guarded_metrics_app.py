"""A small agent system guarded inline by otel_guard, as the dashboards' end-to-end test runs it.

``python guarded_metrics_app.py OTLP_HOST:PORT METRICS_PORT``: spans go over OTLP/gRPC to the
otel-guard processor; the guard's metrics are served on 127.0.0.1:METRICS_PORT/metrics by the
OpenTelemetry Prometheus exporter, where the test's Prometheus scrapes them.

It prints ``serving`` once /metrics is up, then waits for a line on stdin before it delegates, so
the test can have Prometheus scraping it first: the loops then appear as they do in production, as
series born while Prometheus watches. It prints ``done`` once its spans are exported, and exits
when stdin closes (or after five minutes, so it never outlives a crashed test).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import ExitStack

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import start_http_server

import otel_guard
from otel_guard import DelegationRefused, delegate

LONGEST_LIFE_SECONDS = 300.0


def scenario() -> None:
    # Observe mode: planner asks budget, which asks planner again. The guard lets the repeat run
    # and records would_refuse; the processor sees planner>budget>planner in the spans.
    otel_guard.configure(mode="observe", cycle_rule="agent")
    with delegate("planner"):
        with delegate("search", kind="tool"):
            pass
        with delegate("budget"), delegate("planner"):
            pass
    # A deep chain that stays clear of the default max_depth of 8: no alert on depth.
    with ExitStack() as chain:
        for step in range(1, 7):
            chain.enter_context(delegate(f"step{step}"))
    # Enforce mode: a function that calls itself is refused on its second entry.
    otel_guard.configure(mode="enforce")
    try:
        with delegate("summarize"), delegate("summarize"):
            pass
    except DelegationRefused:
        pass


def main(otlp_endpoint: str, metrics_port: int) -> None:
    watchdog = threading.Timer(LONGEST_LIFE_SECONDS, os._exit, args=(3,))
    watchdog.daemon = True
    watchdog.start()
    resource = Resource.create({"service.name": "travel-agents"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True))
    )
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[PrometheusMetricReader()]))
    start_http_server(metrics_port, addr="127.0.0.1")
    print("serving", flush=True)
    sys.stdin.readline()
    scenario()
    tracer_provider.force_flush()
    print("done", flush=True)
    sys.stdin.read()  # until the test closes stdin
    tracer_provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
