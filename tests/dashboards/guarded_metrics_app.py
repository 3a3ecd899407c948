"""A small agent system guarded inline by otel_guard, as the dashboards' end-to-end test runs it.

``python guarded_metrics_app.py OTLP_HOST:PORT METRICS_PORT``: spans go over OTLP/gRPC to the
otel-guard processor; the guard's metrics are served on 127.0.0.1:METRICS_PORT/metrics by the
OpenTelemetry Prometheus exporter, where the test's Prometheus scrapes them.

It prints ``serving`` once /metrics is up, then runs one step for each line it reads on stdin, so
the test can have Prometheus scraping it first (the series are then born while Prometheus watches,
as in production) and can let Prometheus scrape between two steps:

- ``loops``: the delegation loops (a would-refuse, a refusal) and a chain six deep;
- ``budgets``: tree budgets spent (``max_hops`` 2): a would-refuse in observe mode, a refusal in
  enforce mode, both with reason ``budget``;
- ``store_errors``: two hops whose budget store is a Redis URL on a 127.0.0.1 port where nothing
  listens, with ``budget_on_error`` allow: each hop adds one budget store error and still runs.
  The test sends it twice, with a scrape between, so that the error counter grows while
  Prometheus watches (what ``rate()`` needs);
- ``spend``: a tree with ``max_cost`` 0.01 USD and a prices file's model: one response no price
  covers, then two priced responses of 0.006 USD each (the second takes it past its cap), then a
  hop the spent tree is refused (reason ``budget``).

The loops step prints ``loop <cycle> <trace id>`` for each loop, the trace it runs in, by which the
test finds the loop's exemplar and log line. After each step it prints ``<step> done`` once the
step's spans are exported (``store_errors``
adds the number of store errors made so far: ``store_errors done: 2``). It exits when stdin closes
(or after five minutes, so it never outlives a crashed test).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
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
from otel_guard.usage import ModelUsage, after_model_request, before_model_request

LONGEST_LIFE_SECONDS = 300.0
STORE_ERROR_HOPS = 2  # the hops, so the store errors, of one store_errors step
PRICED_MODEL, UNPRICED_MODEL = "travel-llm", "homegrown-llm"
PRICES = {PRICED_MODEL: {"input": 3, "output": 15}}
"""3 and 15 per million tokens: 1,000 input and 200 output tokens cost 0.006 USD."""


def _print_trace(cycle: str) -> None:
    """The trace of the hop being run: the one its loop's exemplar and log line name."""
    trace_id = trace.get_current_span().get_span_context().trace_id
    print(f"loop {cycle} {trace_id:032x}", flush=True)


def loops() -> None:
    # Observe mode: planner asks budget, which asks planner again. The guard lets the repeat run
    # and records would_refuse; the processor sees planner>budget>planner in the spans.
    otel_guard.configure(mode="observe", cycle_rule="agent")
    with delegate("planner"):
        _print_trace("planner>budget>planner")
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
        with delegate("summarize"):
            _print_trace("summarize>summarize")
            with delegate("summarize"):
                pass
    except DelegationRefused:
        pass


def budgets() -> None:
    # Each tree may make two hops; the memory store counts them. No name repeats: no cycle.
    otel_guard.configure(mode="observe", cycle_rule="agent", max_hops=2, budget_store="memory")
    # The dispatcher's tree has made its two hops when it calls the web_search tool: would_refuse.
    with delegate("dispatcher"):
        with delegate("researcher"):
            pass
        with delegate("web_search", kind="tool"):
            pass
    # Enforce mode: the third hop of intake > triage > escalate is refused.
    otel_guard.configure(mode="enforce")
    try:
        with delegate("intake"), delegate("triage"), delegate("escalate"):
            pass
    except DelegationRefused as refused:
        if refused.reason != "budget":
            raise RuntimeError(f"escalate refused for {refused.reason}, not budget") from refused
    else:
        raise RuntimeError("the third hop of a tree with max_hops 2 ran")


class StoreErrors:
    """Hops whose budget store cannot be reached: a Redis URL on a port bound, and so held, by this
    process but not listening, where every connection is refused."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))  # no listen(): nothing answers on this port
        self.url = f"redis://127.0.0.1:{self._socket.getsockname()[1]}/0"
        self.made = 0

    def __call__(self) -> str:
        otel_guard.configure(mode="enforce", max_hops=1000, budget_store=self.url, budget_on_error="allow")
        # budget_on_error allow: both hops run, uncounted (a refusal would end this program).
        with delegate("ledger"), delegate("invoice", kind="tool"):
            pass
        self.made += STORE_ERROR_HOPS
        return f": {self.made}"


def spend() -> None:
    otel_guard.configure(
        mode="enforce", max_hops=0, budget_store="memory", max_cost="0.01", cost_currency="USD", prices=PRICES
    )
    try:
        with delegate("concierge"):
            for model in (UNPRICED_MODEL, PRICED_MODEL, PRICED_MODEL):
                refused = before_model_request()
                if refused is not None:
                    raise RuntimeError(f"a model request of concierge was refused: {refused}")
                after_model_request(ModelUsage(model, 1_000, 200))
            with delegate("booker"):  # 0.012 USD spent of 0.01: refused
                pass
    except DelegationRefused as refused:
        if refused.reason != "budget":
            raise RuntimeError(f"booker refused for {refused.reason}, not budget") from refused
    else:
        raise RuntimeError("a hop of a tree past its max_cost ran")


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
    store_errors = StoreErrors()
    steps: dict[str, Callable[[], str | None]] = {
        "loops": loops,
        "budgets": budgets,
        "store_errors": store_errors,
        "spend": spend,
    }
    print("serving", flush=True)
    for line in sys.stdin:  # until the test closes stdin
        step = line.strip()
        detail = steps[step]()
        tracer_provider.force_flush()
        print(f"{step} done{detail or ''}", flush=True)
    tracer_provider.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
