"""Measure what the alert rules and the dashboard cost Prometheus at the processor's series cap.

Not a test (pytest does not collect it): ``.venv/bin/python tests/dashboards/measure_queries.py``.

A synthetic exporter serves the processor's metrics at their cardinality cap (10,000 cycle label
sets: the processor folds more into ``_overflow``), plus delegation edges (half of them on a loop, in
``otel_guard_cycle_edges_total``), span decisions and the
guard's own decisions and depth histogram; a fraction of the counters grows on every scrape and
new cycle series keep being born. A real Prometheus scrapes it every 2 seconds (the exporter, in
Python, takes about a second to write 25,000 series on a loaded machine) for two minutes, which puts
60 samples of each series in a two-minute window: what a 15-minute alert window holds at a 15 s
scrape interval. Then it reports the rule groups' evaluation time (Prometheus's own
``prometheus_rule_group_last_duration_seconds``) and Prometheus's evaluation time of every rule
expression and every dashboard query (``stats=all``), with ``$__range`` and ``$__rate_interval`` of
two minutes.

All the series are younger than the rules' 15-minute windows, so every cycle counts as new and is
an alert instance: the worst case, as when a Prometheus first scrapes a processor at its cap.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from dashboard_files import PROMETHEUS_RULES, dashboard_queries, load_dashboard, prometheus_rules, substitute
from live_stack import PrometheusServer, free_port
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

CYCLES = 10_000  # the processor's cap of label sets a metric (MAX_SERIES)
EDGES = 5_000
SPAN_DECISIONS = 3_000
AGENTS = 1_000  # guard decision series: agents x (allow, refuse, would_refuse)
SCRAPE_SECONDS = 120
SCRAPE_INTERVAL = "2s"


Tally = dict[tuple[str, ...], int]


class SyntheticLoad(Collector):
    """Counters at the cap, a tenth of them growing each scrape, new cycles born as it runs."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.rng = random.Random(7)
        self.cycles: Tally = {("cross_function", f"a{i}>b{i}>a{i}"): 1 for i in range(CYCLES - 600)}
        self.edges: Tally = {(f"a{i}", f"b{i}"): 1 for i in range(EDGES)}
        self.cycle_edges: Tally = {(f"a{i}", f"b{i}"): 1 for i in range(0, EDGES, 2)}
        self.decisions: Tally = {("would_refuse", "cycle", f"agent{i}"): 1 for i in range(SPAN_DECISIONS)}
        # The would-refuse decisions name agents the span decisions name too: the would-refuse
        # alerts' joins between the two sources match.
        self.guard: Tally = {
            (decision, reason, f"agent{i}"): 1
            for i in range(AGENTS)
            for decision, reason in (("allow", ""), ("refuse", "cycle"), ("would_refuse", "cycle"))
        }

    def _grow(self, tally: Tally) -> None:
        keys = list(tally)
        for key in self.rng.sample(keys, len(keys) // 10):
            tally[key] += 1

    def collect(self) -> Iterator[Metric]:
        self.scrapes += 1
        for tally in (self.cycles, self.edges, self.cycle_edges, self.decisions, self.guard):
            self._grow(tally)
        for _ in range(10):  # ten new cycles a scrape, up to the cap
            if len(self.cycles) < CYCLES:
                self.cycles[("direct", f"n{len(self.cycles)}>n{len(self.cycles)}")] = 1
        yield _counter("otel_guard_cycles", ("kind", "cycle"), self.cycles)
        yield _counter("otel_guard_delegations", ("caller", "callee"), self.edges)
        yield _counter("otel_guard_cycle_edges", ("caller", "callee"), self.cycle_edges)
        yield _counter("otel_guard_span_decisions", ("decision", "reason", "agent"), self.decisions)
        yield _counter(
            "otel_guard_decisions",
            ("otel_guard_decision", "otel_guard_reason", "gen_ai_agent_name"),
            self.guard,
        )
        depth = HistogramMetricFamily("otel_guard_chain_depth", "depth")
        n = self.scrapes * 100
        buckets = [(f"{b}.0", n * min(b, 6) // 6) for b in (1, 2, 3, 4, 5, 6, 8)] + [("+Inf", n)]
        depth.add_metric([], buckets, n * 3.0)
        yield depth


def _counter(name: str, labels: tuple[str, ...], tally: Tally) -> CounterMetricFamily:
    family = CounterMetricFamily(name, name, labels=labels)
    for key, value in tally.items():
        family.add_metric(list(key), value)
    return family


def rule_group_seconds(prometheus: PrometheusServer) -> dict[str, float]:
    text = prometheus.client.get("/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name == "prometheus_rule_group_last_duration_seconds":
            for sample in family.samples:
                found[sample.labels["rule_group"].rsplit(";", 1)[-1]] = sample.value
    return found


def evaluation(prometheus: PrometheusServer, expr: str) -> tuple[float, int, float]:
    """Prometheus's own evaluation time of an instant query (ms, median of 3; the HTTP transfer of
    the result left out), the series it returns, and the samples it reads."""
    runs = []
    for _ in range(3):
        answer = prometheus.client.post("/api/v1/query", data={"query": expr, "stats": "all"}).json()
        assert answer["status"] == "success", answer
        runs.append(answer["data"]["stats"]["timings"]["evalTotalTime"] * 1000)
    stats = answer["data"]["stats"]
    return statistics.median(runs), len(answer["data"]["result"]), stats["samples"]["totalQueryableSamples"]


def main() -> None:
    registry = CollectorRegistry()
    registry.register(SyntheticLoad())
    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    with tempfile.TemporaryDirectory() as workdir:
        prometheus = PrometheusServer(
            Path(workdir),
            {"otel-guard-processor": f"127.0.0.1:{port}"},
            [PROMETHEUS_RULES],
            evaluation_interval="10s",
            scrape_interval=SCRAPE_INTERVAL,
        )
        try:
            prometheus.wait_ready()
            time.sleep(SCRAPE_SECONDS + 5)
            series = prometheus.vector("count({__name__=~'otel_guard_.+'})")[0][1]
            samples = prometheus.vector("sum(count_over_time(otel_guard_cycles_total[2m]))")[0][1]
            print(f"{series:.0f} series; {samples / CYCLES:.0f} samples a cycle series in a 2-minute window")
            groups = rule_group_seconds(prometheus)
            alerts = prometheus.vector("count(ALERTS)")
            print(f"alert instances active: {alerts[0][1] if alerts else 0:.0f}")
            for group, seconds in groups.items():
                print(
                    f"rule group {group}: last evaluation {seconds * 1000:.0f} ms (alerts' upkeep included)"
                )
            print("rules, Prometheus's evaluation time of the expression alone:")
            for rule in prometheus_rules():
                ms, returned, read = evaluation(prometheus, rule["expr"])
                print(f"  {ms:7.1f} ms  {returned:6d} series  {read:9.0f} samples  {rule['alert']}")
            values = {
                "service": ".*",
                "processor": ".*",
                "cycle": ".*",
                "max_depth": "8",
                "__range": "2m",
                "__rate_interval": "2m",
                "__interval": "15s",
            }
            timings = [
                (*evaluation(prometheus, substitute(query.expr, values)), query.where)
                for query in dashboard_queries(load_dashboard())
            ]
            timings.sort(reverse=True)
            total = sum(t[0] for t in timings)
            print(f"dashboard: {len(timings)} queries, {total:.0f} ms of evaluation in all; slowest:")
            for ms, returned, read, where in timings[:6]:
                print(f"  {ms:7.1f} ms  {returned:6d} series  {read:9.0f} samples  {where}")
        finally:
            prometheus.stop()
            server.shutdown()


if __name__ == "__main__":
    main()
