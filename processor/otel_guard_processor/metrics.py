"""The processor's Prometheus metrics: plain-dict tallies, turned into metric families at scrape time.

The engine counts and the detector (:class:`~otel_guard_processor.engine.EngineDetector`) adds
each request's counts into dicts, once a request; :class:`ProcessorCollector` reads those tallies,
and those of :class:`RequestStats`, when Prometheus scrapes ``/metrics``. A scrape is taken in the
detection queue (:mod:`otel_guard_processor.detection`), never in the middle of a request's
detection: it sees a consistent snapshot that counts every request acknowledged before it.

Each cycle series carries the span where the latest counted cycle closed as an exemplar, and each
decision series the latest span of that decision; only the OpenMetrics exposition writes them: the
plain text format has no place for them and leaves them out.

Metric names are listed in docs/processor.md; a test checks that list against ``/metrics``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import pairwise
from typing import Generic, Protocol, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Exemplar

from otel_guard_processor.bounds import CUT, MAX_SERIES, OVERFLOW, TREE_HOPS_BUCKETS

__all__ = [
    "LATENCY_BUCKETS",
    "ProcessorCollector",
    "RequestStats",
    "Tallies",
    "cycle_edges",
    "new_registry",
]

SPAN_OUTCOMES = ("received", "forwarded", "rejected")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Histogram:
    """Fixed-bucket latency tallies: one list of counts and a sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        return _cumulative(LATENCY_BUCKETS, self.counts)


def _cumulative(bounds: Iterable[float], counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus buckets (``le``, cumulative count) of per-bucket ``counts``, the last past ``bounds``."""
    cumulative = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        cumulative += count
        out.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    return out


class RequestStats:
    """Tallies of the receivers and the forwarder (the detector keeps its own)."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}  # (protocol, outcome) -> requests
        self.received_bytes: dict[str, int] = {}  # protocol -> bytes
        self.spans: dict[str, int] = dict.fromkeys(SPAN_OUTCOMES, 0)
        self.unread_requests: dict[tuple[str, str], int] = {}  # (signal, outcome) -> requests
        self.downstream_errors: dict[str, int] = {}  # gRPC status name -> errors
        self.detection_errors = 0
        self.inflight = 0
        self.pending_bytes = 0  # of requests held: not yet both answered and detected
        # Bytes the receivers hold before the pipeline has them (the gRPC receiver's calls being
        # read or waiting to be taken): in the pending_bytes metric too.
        self.held_elsewhere: Callable[[], int] = lambda: 0
        self._latency: dict[str, _Histogram] = {}

    def request(self, protocol: str, outcome: str, size: int, seconds: float) -> None:
        key = (protocol, outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
        self.received_bytes[protocol] = self.received_bytes.get(protocol, 0) + size
        histogram = self._latency.get(protocol)
        if histogram is None:
            histogram = self._latency[protocol] = _Histogram()
        histogram.observe(seconds)

    def unread(self, signal: str, outcome: str) -> None:
        """One metrics or logs request taken: forwarded, discarded (no downstream) or rejected."""
        key = (signal, outcome)
        self.unread_requests[key] = self.unread_requests.get(key, 0) + 1

    def latency(self) -> dict[str, _Histogram]:
        return self._latency


_TRACE_ID_BYTES = 16
_SPAN_ID_BYTES = 8

SpanAt = tuple[bytes, bytes, float]
K = TypeVar("K", bound=tuple[str, ...])


class Tallies(Protocol):
    """What the metrics read of the detector (:class:`~otel_guard_processor.engine.EngineDetector`)."""

    cycles: dict[tuple[str, str], int]
    cycle_spans: dict[tuple[str, str], SpanAt]
    delegations: dict[tuple[str, str], int]
    decisions: dict[tuple[str, str, str], int]
    decision_spans: dict[tuple[str, str, str], SpanAt]
    evictions: dict[str, int]
    dropped: dict[str, int]
    duplicates: int
    truncated: dict[str, int]
    tree_hops: list[int]
    tree_hops_sum: int
    tree_evictions: dict[str, int]

    @property
    def active_traces(self) -> int: ...
    @property
    def active_trees(self) -> int: ...
    @property
    def stored_spans(self) -> int: ...
    @property
    def pending_spans(self) -> int: ...


def exemplar(at: SpanAt) -> Exemplar | None:
    """The exemplar ``{trace_id, span_id}`` (lowercase hex) of a span a count points at, with the
    time it was counted; None for ids that are not those of a real span (16 and 8 bytes, not all
    zero): the processor does not check ids, and a trace store could find nothing by them."""
    trace_id, span_id, when = at
    if len(trace_id) != _TRACE_ID_BYTES or len(span_id) != _SPAN_ID_BYTES:
        return None
    if not any(trace_id) or not any(span_id):
        return None
    return Exemplar({"trace_id": trace_id.hex(), "span_id": span_id.hex()}, 1.0, when)


class _Exemplars(Generic[K]):
    """The exemplars of one metric's series, each made again only when its span changes."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[K, tuple[SpanAt, Exemplar | None]] = {}

    def of(self, spans: Mapping[K, SpanAt]) -> dict[K, Exemplar]:
        made = self._made
        out: dict[K, Exemplar] = {}
        for series, at in spans.items():
            known = made.get(series)
            if known is None or known[0] is not at:
                known = made[series] = (at, exemplar(at))
            if known[1] is not None:
                out[series] = known[1]
        return out


def cycle_edges(cycles: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Per delegation edge (caller, callee), the cycles counted whose loop takes it, each once.

    A label's names, joined by ``>``, are its edges in order; a label cut to its bound loses its
    last, cut name, and the cycles folded into ``OVERFLOW`` name no edge. At most MAX_SERIES edges,
    the rest counted under (OVERFLOW, OVERFLOW).
    """
    edges: dict[tuple[str, str], int] = {}
    for (_kind, label), count in cycles.items():
        if label == OVERFLOW:
            continue
        names = label.split(">")
        if label.endswith(CUT):
            names.pop()
        for pair in dict.fromkeys(pairwise(names)):
            edge = pair if pair in edges or len(edges) < MAX_SERIES else (OVERFLOW, OVERFLOW)
            edges[edge] = edges.get(edge, 0) + count
    return edges


class ProcessorCollector(Collector):
    """Exposes the detector's and the receivers' tallies as Prometheus metric families."""

    def __init__(self, detector: Tallies, stats: RequestStats) -> None:
        self._detector = detector
        self._stats = stats
        self._cycle_exemplars = _Exemplars[tuple[str, str]]()
        self._decision_exemplars = _Exemplars[tuple[str, str, str]]()
        # cycle_edges of the cycles as they were at (number of series, total count): the counts
        # only grow, so any change changes the pair, and an unchanged scrape does not redo it.
        self._edges_of: tuple[int, int] = (0, 0)
        self._edges: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterator[Metric]:
        detector, stats = self._detector, self._stats
        yield _counter(
            "otel_guard_cycles",
            "Distinct delegation cycles, each counted once in the trace where a name repeats.",
            ("kind", "cycle"),
            detector.cycles.items(),
            self._cycle_exemplars.of(detector.cycle_spans),
        )
        yield _counter(
            "otel_guard_delegations",
            "Calls, each counted on the edge from its nearest named ancestor.",
            ("caller", "callee"),
            detector.delegations.items(),
        )
        yield _counter(
            "otel_guard_cycle_edges",
            "Counted cycles whose loop takes this delegation edge, each cycle once per edge.",
            ("caller", "callee"),
            self._cycle_edges().items(),
        )
        yield _counter(
            "otel_guard_span_decisions",
            "Guard decisions read from otel_guard.decision on incoming spans.",
            ("decision", "reason", "agent"),
            detector.decisions.items(),
            self._decision_exemplars.of(detector.decision_spans),
        )
        tree_hops = HistogramMetricFamily(
            "otel_guard_tree_hops",
            "Hops of a delegation tree (otel_guard.chain.root): the largest otel_guard.budget.hops "
            "seen, observed once per tree when its state is let go.",
        )
        tree_hops.add_metric([], _cumulative(TREE_HOPS_BUCKETS, detector.tree_hops), detector.tree_hops_sum)
        yield tree_hops
        yield _counter(
            "otel_guard_processor_spans",
            "Spans received, forwarded downstream (acknowledged), and rejected back to the client.",
            ("outcome",),
            [((outcome,), count) for outcome, count in stats.spans.items()],
        )
        yield _counter(
            "otel_guard_processor_unread_requests",
            "Metrics and logs export requests, passed on unread: forwarded downstream (acknowledged), "
            "discarded (answered OK, no downstream), rejected back to the client.",
            ("signal", "outcome"),
            stats.unread_requests.items(),
        )
        yield _counter(
            "otel_guard_processor_requests",
            "Export requests of every signal, by protocol and outcome.",
            ("protocol", "outcome"),
            stats.requests.items(),
        )
        yield _counter(
            "otel_guard_processor_received_bytes",
            "Bytes of export requests received (after decompression).",
            ("protocol",),
            [((protocol,), size) for protocol, size in stats.received_bytes.items()],
        )
        latency = HistogramMetricFamily(
            "otel_guard_processor_request_duration_seconds",
            "Time from receiving an export request to answering it, downstream included.",
            labels=("protocol",),
        )
        for protocol, histogram in stats.latency().items():
            latency.add_metric([protocol], histogram.buckets(), histogram.total)
        yield latency
        yield _counter(
            "otel_guard_processor_downstream_errors",
            "Forwarding failures by gRPC status (busy and timeout are the processor's own).",
            ("code",),
            [((code,), count) for code, count in stats.downstream_errors.items()],
        )
        yield _counter(
            "otel_guard_processor_detection_errors",
            "Requests whose detection failed unexpectedly (they were forwarded all the same).",
            (),
            [((), stats.detection_errors)],
        )
        yield _counter(
            "otel_guard_processor_trace_evictions",
            "Traces dropped from detection state, by reason (ttl, capacity).",
            ("reason",),
            [((reason,), count) for reason, count in detector.evictions.items()],
        )
        yield _counter(
            "otel_guard_processor_dropped_spans",
            "Spans left out of detection, by reason (trace_full); they are still forwarded.",
            ("reason",),
            [((reason,), count) for reason, count in detector.dropped.items()],
        )
        yield _counter(
            "otel_guard_processor_truncated_values",
            "Names (to 256 characters) and cycle labels (to 1024) cut to their bound, by what (name, label).",
            ("what",),
            [((what,), count) for what, count in detector.truncated.items()],
        )
        yield _counter(
            "otel_guard_processor_duplicate_spans",
            "Spans received again while their trace was held; not counted twice.",
            (),
            [((), detector.duplicates)],
        )
        yield _counter(
            "otel_guard_processor_tree_evictions",
            "Delegation trees let go of (their hops observed), by reason (ttl, capacity).",
            ("reason",),
            [((reason,), count) for reason, count in detector.tree_evictions.items()],
        )
        yield _gauge("otel_guard_processor_active_traces", "Traces held.", detector.active_traces)
        yield _gauge(
            "otel_guard_processor_active_trees",
            "Delegation trees held (those whose spans carry otel_guard.budget.hops).",
            detector.active_trees,
        )
        yield _gauge("otel_guard_processor_held_spans", "Spans held.", detector.stored_spans)
        yield _gauge(
            "otel_guard_processor_waiting_spans",
            "Held spans still waiting for their parent or linked span.",
            detector.pending_spans,
        )
        yield _gauge(
            "otel_guard_processor_inflight_requests",
            "Export requests being handled now.",
            stats.inflight,
        )
        yield _gauge(
            "otel_guard_processor_pending_bytes",
            "Bytes of export requests held: being received, waiting for the downstream's answer or "
            "for detection.",
            stats.pending_bytes + stats.held_elsewhere(),
        )

    def _cycle_edges(self) -> dict[tuple[str, str], int]:
        cycles = self._detector.cycles
        state = (len(cycles), sum(cycles.values()))
        if state != self._edges_of:
            self._edges_of, self._edges = state, cycle_edges(cycles)
        return self._edges


def _counter(
    name: str,
    documentation: str,
    labels: tuple[str, ...],
    samples: Iterable[tuple[K, float]],
    exemplars: Mapping[K, Exemplar] | None = None,
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for label_values, value in samples:
        exemplar = exemplars.get(label_values) if exemplars else None
        family.add_metric(list(label_values), value, exemplar=exemplar)
    return family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def new_registry(detector: Tallies, stats: RequestStats) -> CollectorRegistry:
    """A registry holding only the processor's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessorCollector(detector, stats))
    return registry
