"""The decision counter's exemplars: a refusal or would-refuse points at the trace it happened in.

``otel_guard.decisions`` is an observable counter; its refusing series carry, through the real
OpenTelemetry SDK, an exemplar of the span context their latest hop was decided in, as
``OTEL_METRICS_EXEMPLAR_FILTER`` allows. An allowed hop keeps nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import otel_guard
from otel_guard import DelegationRefused, delegate, telemetry
from otel_guard.telemetry import HopTally


class Providers:
    """A tracer and a meter provider of the test's own, bound as the guard's."""

    def __init__(self, **tracer_options: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(**tracer_options)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def span(self, name: str) -> ReadableSpan:
        (found,) = [s for s in self.exporter.get_finished_spans() if s.name == name]
        return found

    def exemplars(self) -> dict[str, list[tuple[int, int]]]:
        """Decision -> the (trace id, span id) of each exemplar on its series (one agent each here)."""
        data = self.reader.get_metrics_data()
        assert data is not None
        found: dict[str, list[tuple[int, int]]] = {}
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name != telemetry.METRIC_DECISIONS:
                        continue
                    for point in metric.data.data_points:
                        decision = str(dict(point.attributes or {})[telemetry.DECISION])
                        pairs = [(e.trace_id or 0, e.span_id or 0) for e in point.exemplars]
                        found.setdefault(decision, []).extend(pairs)
        return found


@pytest.fixture
def providers() -> Iterator[Providers]:
    own = Providers()
    with telemetry.bound(own.tracer_provider, own.meter_provider):
        yield own
    own.meter_provider.shutdown()


def _ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def test_a_refusal_carries_the_trace_and_its_own_span(providers: Providers) -> None:
    otel_guard.configure(cycle_rule="agent")
    with pytest.raises(DelegationRefused), delegate("planner"), delegate("budget"), delegate("planner"):
        pass
    # The refused hop's span is the child of budget's, in the same trace.
    budget = providers.span("invoke_agent budget")
    refused = [
        s for s in providers.exporter.get_finished_spans() if s.attributes["otel_guard.decision"] == "refuse"
    ]
    assert refused[0].parent is not None
    assert refused[0].parent.span_id == _ids(budget)[1]
    assert providers.exemplars() == {"allow": [], "refuse": [_ids(refused[0])]}


def test_a_would_refuse_in_observe_mode_carries_its_latest_trace(providers: Providers) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    for _ in range(2):
        with delegate("planner"), delegate("budget"), delegate("planner"):
            pass
    flagged = [
        s
        for s in providers.exporter.get_finished_spans()
        if s.attributes is not None and s.attributes["otel_guard.decision"] == "would_refuse"
    ]
    latest = max(flagged, key=lambda s: s.start_time or 0)
    assert len(flagged) == 2
    assert providers.exemplars() == {"allow": [], "would_refuse": [_ids(latest)]}


def test_no_exemplar_where_the_filter_takes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """``always_off`` turns them off; under ``trace_based`` (the default) a hop in a trace that is
    not sampled makes none, as the SDK's other exemplars."""
    otel_guard.configure(cycle_rule="agent")
    for filter_name, tracer_options in (("always_off", {}), ("trace_based", {"sampler": ALWAYS_OFF})):
        monkeypatch.setenv("OTEL_METRICS_EXEMPLAR_FILTER", filter_name)
        own = Providers(**tracer_options)
        with telemetry.bound(own.tracer_provider, own.meter_provider):
            with pytest.raises(DelegationRefused), delegate("summarize"), delegate("summarize"):
                pass
            assert own.exemplars() == {"allow": [], "refuse": []}, filter_name
        own.meter_provider.shutdown()


def test_a_hop_span_given_to_the_tally_is_the_exemplar(providers: Providers) -> None:
    """``HopTally.add(key, span)``: the guard may hand over the refused hop's own span."""
    tally = HopTally()
    refuse = ("refuse", "cycle", telemetry.GEN_AI_AGENT_NAME, "planner")
    tracer = providers.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        hop = tracer.start_span("invoke_agent planner")
        tally.add((refuse, 2), hop)
        tally.add((("allow", None, telemetry.GEN_AI_AGENT_NAME, "budget"), 1))
        hop.end()
    assert tally.refused_in() == {refuse: hop.get_span_context()}
    assert caller.get_span_context() != hop.get_span_context()
