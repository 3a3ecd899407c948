"""The processor's Prometheus metrics: plain-dict tallies, turned into metric families at scrape time.

The engine counts and the detector (:class:`~otel_guard_processor.engine.EngineDetector`) adds
each request's counts into dicts, once a request; :class:`ProcessorCollector` reads those tallies,
and those of :class:`RequestStats`, when Prometheus scrapes ``/metrics``. A scrape is taken in the
detection queue (:mod:`otel_guard_processor.detection`), never in the middle of a request's
detection: it sees a consistent snapshot that counts every request acknowledged before it.

Each cycle series carries the span where the latest counted cycle closed as an exemplar (with the
loop's ``chain_root`` when its guard spans name one), and each
decision series the latest span of that decision; only the OpenMetrics exposition writes them: the
plain text format has no place for them and leaves them out.

The four metrics whose label values senders choose (cycles, delegations, cycle edges, decisions)
hold at most ``MAX_SERIES`` label sets each (the detector folds the rest into ``OVERFLOW``), and
each shows at most ``MAX_FAMILY_BYTES`` of them on ``/metrics``: its series in the order they first
came while they fit, the rest added into its ``OVERFLOW`` series. A counted series never moves into
``OVERFLOW`` later (those before it do not grow), so every series only grows. A scrape is at most
about four times ``MAX_FAMILY_BYTES`` whatever the senders sent.

What a reader would not guess: ``/metrics`` is rendered by :func:`choose_encoder` rather than
prometheus_client's own, with the same text, and not on the event loop that every receiver shares:
the scrape copies the tallies there (in the detection queue, so the copy is consistent) and renders
the copy on a worker thread. The four large metrics' text is kept between scrapes and made again
only when their counts changed (counts only grow, so their number and sum say so).

Metric names are listed in docs/processor.md; a test checks that list against ``/metrics``.
"""

from __future__ import annotations

import asyncio
import copy
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from functools import partial
from itertools import pairwise
from typing import Final, Generic, Protocol, TypeVar

from prometheus_client import exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Exemplar

from otel_guard_processor._engine import cycle_names
from otel_guard_processor.bounds import CUT, MAX_SERIES, OVERFLOW, TREE_HOPS_BUCKETS

__all__ = [
    "LATENCY_BUCKETS",
    "MAX_FAMILY_BYTES",
    "ProcessorCollector",
    "RequestStats",
    "Tallies",
    "choose_encoder",
    "cycle_edges",
    "new_registry",
]

SPAN_OUTCOMES = ("received", "forwarded", "rejected")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_FAMILY_BYTES: Final = 1024 * 1024
"""The most bytes of series one of the four large metrics shows on ``/metrics`` (in OpenMetrics,
exemplars included); the rest is added into its ``OVERFLOW`` series."""
# A series' bytes besides its name and label values: braces, quotes, the value, a newline (at most).
_SERIES_BYTES: Final = 32
# An exemplar: ' # {span_id="<16 hex>",trace_id="<32 hex>"} 1.0 <seconds since the epoch>'.
_EXEMPLAR_BYTES: Final = 100


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
        # Bytes of requests held, by every holder (the processor's one memory budget: receivers,
        # conversion, pipeline, forwarder): what the pending_bytes metric shows.
        self.held_bytes: Callable[[], int] = lambda: 0
        # What the receivers' budgets counted of the room each keeps for the largest request it
        # refused: (share, outcome) -> count (otel_guard_processor.budget_shares).
        self.kept_room: Callable[[], dict[tuple[str, str], int]] = dict
        self._latency: dict[str, _Histogram] = {}

    @property
    def pending_bytes(self) -> int:
        """Bytes of requests held now (the memory budget's, ``held_bytes``)."""
        return self.held_bytes()

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
MAX_EXEMPLAR_CHARS = 128  # OpenMetrics: an exemplar's label names and values together
_EXEMPLAR_CHARS = len("trace_id") + 2 * _TRACE_ID_BYTES + len("span_id") + 2 * _SPAN_ID_BYTES

SpanAt = tuple[bytes, bytes, float]
K = TypeVar("K", bound=tuple[str, ...])


class Tallies(Protocol):
    """What the metrics read of the detector (:class:`~otel_guard_processor.engine.EngineDetector`)."""

    cycles: dict[tuple[str, str], int]
    cycle_spans: dict[tuple[str, str], SpanAt]
    cycle_roots: dict[tuple[str, str], str | None]
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


def exemplar(at: SpanAt, chain_root: str | None = None) -> Exemplar | None:
    """The exemplar ``{trace_id, span_id}`` (lowercase hex) of a span a count points at, with the
    time it was counted, and ``chain_root`` where one is given and fits; None for ids that are not
    those of a real span (16 and 8 bytes, not all zero): the processor does not check ids, and a
    trace store could find nothing by them. OpenMetrics bounds an exemplar's label names and values
    to 128 characters together: the ids take 63, so a root of up to 55 characters (the guard's are
    32) is carried, a longer one left out (the log line still names it)."""
    trace_id, span_id, when = at
    if len(trace_id) != _TRACE_ID_BYTES or len(span_id) != _SPAN_ID_BYTES:
        return None
    if not any(trace_id) or not any(span_id):
        return None
    labels = {"trace_id": trace_id.hex(), "span_id": span_id.hex()}
    if chain_root and _EXEMPLAR_CHARS + len("chain_root") + len(chain_root) <= MAX_EXEMPLAR_CHARS:
        labels["chain_root"] = chain_root
    return Exemplar(labels, 1.0, when)


class _Exemplars(Generic[K]):
    """The exemplars of one metric's series, each made again only when its span changes."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[K, tuple[SpanAt, Exemplar | None]] = {}

    def of(
        self, spans: Mapping[K, SpanAt], roots: Mapping[K, str | None] | None = None
    ) -> Callable[[K], Exemplar | None]:
        """The exemplar of a series (None without one), made when a scrape shows that series, with
        its count's chain root where ``roots`` names one."""
        made = self._made

        def exemplar_of(series: K) -> Exemplar | None:
            at = spans.get(series)
            if at is None:
                return None
            known = made.get(series)
            if known is None or known[0] is not at:  # a new count: a new span, and its root
                known = made[series] = (at, exemplar(at, roots.get(series) if roots else None))
            return known[1]

        return exemplar_of


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
        names = cycle_names(label)  # each name's `>` and `\` escaped in the label
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
        self._edge_cache = _Edges()
        # Per content type: the large metrics' text as of their version (see render).
        self._rendered: dict[str, dict[str, tuple[tuple[int, int], bytes]]] = {}

    def collect(self) -> Iterator[Metric]:
        for _, build in self._large():
            yield build()
        yield from self._small()

    def render(self, encode: Callable[[Collector], bytes], content_type: str) -> bytes:
        """What ``encode`` (prometheus_client's encoder of ``content_type``) makes of
        :meth:`collect`, the large metrics' text taken from the previous scrape of the same
        content type where their counts did not change."""
        openmetrics = content_type.startswith("application/openmetrics-text")
        rendered = self._rendered.get(content_type)
        if rendered is None:
            if len(self._rendered) >= _FORMATS:  # formats a scraper asked for: few, but its choice
                self._rendered.clear()
            rendered = self._rendered[content_type] = {}
        parts: list[bytes] = []
        for version, build in self._large():
            text = rendered.get(build.__name__)
            if text is None or text[0] != version:
                text = rendered[build.__name__] = (version, _text(encode, [build()], openmetrics))
            parts.append(text[1])
        parts.append(_text(encode, list(self._small()), openmetrics))
        if openmetrics:
            parts.append(_EOF)
        return b"".join(parts)

    def _large(self) -> list[tuple[tuple[int, int], Callable[[], Metric]]]:
        """The metrics whose label values senders choose: (a version that changes whenever their
        counts do, their maker)."""
        detector = self._detector
        cycles = _version(detector.cycles)
        return [
            (cycles, self._cycles),
            (_version(detector.delegations), self._delegations),
            (cycles, self._edges),
            (_version(detector.decisions), self._decisions),
        ]

    def _cycles(self) -> Metric:
        return _counter(
            "otel_guard_cycles",
            "Distinct delegation cycles, each counted once in the trace where a name repeats.",
            ("kind", "cycle"),
            _capped(self._detector.cycles, "otel_guard_cycles", ("kind", "cycle"), exemplars=True),
            self._cycle_exemplars.of(self._detector.cycle_spans, self._detector.cycle_roots),
        )

    def _delegations(self) -> Metric:
        return _counter(
            "otel_guard_delegations",
            "Calls, each counted on the edge from its nearest named ancestor.",
            ("caller", "callee"),
            _capped(self._detector.delegations, "otel_guard_delegations", ("caller", "callee")),
        )

    def _edges(self) -> Metric:
        return _counter(
            "otel_guard_cycle_edges",
            "Counted cycles whose loop takes this delegation edge, each cycle once per edge.",
            ("caller", "callee"),
            _capped(self._cycle_edges(), "otel_guard_cycle_edges", ("caller", "callee")),
        )

    def _decisions(self) -> Metric:
        return _counter(
            "otel_guard_span_decisions",
            "Guard decisions read from otel_guard.decision on incoming spans.",
            ("decision", "reason", "agent"),
            _capped(
                self._detector.decisions,
                "otel_guard_span_decisions",
                ("decision", "reason", "agent"),
                exemplars=True,
            ),
            self._decision_exemplars.of(self._detector.decision_spans),
        )

    def _small(self) -> Iterator[Metric]:
        detector, stats = self._detector, self._stats
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
            "otel_guard_processor_kept_room",
            "Room the memory budget kept for the largest request it refused, by receiver share (grpc, "
            "http) and outcome: kept (begun), claimed (taken by a request as large), expired (nobody came "
            "back in time), refused (smaller requests refused to leave it free).",
            ("share", "outcome"),
            sorted(stats.kept_room().items()),
        )
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
            stats.pending_bytes,
        )

    def _cycle_edges(self) -> dict[tuple[str, str], int]:
        cycles = self._detector.cycles
        state = (len(cycles), sum(cycles.values()))
        edges = self._edge_cache
        if state != edges.of:
            edges.of, edges.made = state, cycle_edges(cycles)
        return edges.made

    def snapshot(self) -> ProcessorCollector:
        """A collector of the tallies as they are now, sharing this one's kept text and exemplars:
        to render on another thread while the event loop goes on changing the tallies."""
        view = copy.copy(self)
        view._detector = _Snapshot(self._detector)
        view._stats = _stats_copy(self._stats)
        return view


def _counter(
    name: str,
    documentation: str,
    labels: tuple[str, ...],
    samples: Iterable[tuple[K, float]],
    exemplars: Callable[[K], Exemplar | None] | None = None,
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for label_values, value in samples:
        exemplar = exemplars(label_values) if exemplars else None
        family.add_metric(list(label_values), value, exemplar=exemplar)
    return family


def _capped(
    tally: Mapping[K, int], name: str, labels: tuple[str, ...], exemplars: bool = False
) -> list[tuple[K, int]]:
    """The series of ``tally`` that one metric shows: in the order they came while they fit in
    MAX_FAMILY_BYTES, then its ``OVERFLOW`` series with the counts of the rest added in."""
    overflow = tuple(OVERFLOW for _ in labels)
    # A series' bytes but its label values: its name and labels' names, quotes, value, exemplar.
    each = len(name) + len("_total") + sum(len(label) + 4 for label in labels) + _SERIES_BYTES
    each += _EXEMPLAR_BYTES if exemplars else 0
    room = MAX_FAMILY_BYTES - each - len(OVERFLOW) * len(labels)  # kept for the overflow series
    shown: list[tuple[K, int]] = []
    folded = 0
    for series, count in tally.items():
        if series == overflow:
            folded += count
            continue
        if room >= 0:
            room -= each + sum(_escaped_bytes(value) for value in series)
        if room < 0:
            folded += count
            continue
        shown.append((series, count))
    if folded or overflow in tally:
        shown.append((overflow, folded))  # type: ignore[arg-type]
    return shown


def _escaped_bytes(value: str) -> int:
    """The bytes of a label value in the exposition (UTF-8, ``\\``, ``"`` and newlines escaped)."""
    return len(value.encode()) + value.count("\\") + value.count('"') + value.count("\n")


def _version(tally: Mapping[K, int]) -> tuple[int, int]:
    """Changes whenever a tally of growing counts does: its number of series and their sum."""
    return len(tally), sum(tally.values())


_FORMATS: Final = 4
_EOF: Final = b"# EOF\n"


class _Families:
    """Metric families as prometheus_client's encoders take them (anything with ``collect``)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def _text(encode: Callable[[Collector], bytes], families: list[Metric], openmetrics: bool) -> bytes:
    text = encode(_Families(families))
    return text[: -len(_EOF)] if openmetrics and text.endswith(_EOF) else text


class _Edges:
    """cycle_edges of the cycles as they were at ``of`` (number of series, total count)."""

    __slots__ = ("made", "of")

    def __init__(self) -> None:
        self.of: tuple[int, int] = (0, 0)
        self.made: dict[tuple[str, str], int] = {}


class _Snapshot:
    """What the metrics read of a detector (:class:`Tallies`), copied."""

    def __init__(self, detector: Tallies) -> None:
        self.cycles = dict(detector.cycles)
        self.cycle_spans = dict(detector.cycle_spans)
        self.cycle_roots = dict(detector.cycle_roots)
        self.delegations = dict(detector.delegations)
        self.decisions = dict(detector.decisions)
        self.decision_spans = dict(detector.decision_spans)
        self.evictions = dict(detector.evictions)
        self.dropped = dict(detector.dropped)
        self.duplicates = detector.duplicates
        self.truncated = dict(detector.truncated)
        self.tree_hops = list(detector.tree_hops)
        self.tree_hops_sum = detector.tree_hops_sum
        self.tree_evictions = dict(detector.tree_evictions)
        self.active_traces = detector.active_traces
        self.active_trees = detector.active_trees
        self.stored_spans = detector.stored_spans
        self.pending_spans = detector.pending_spans


def _stats_copy(stats: RequestStats) -> RequestStats:
    copied = copy.copy(stats)
    for name in ("requests", "received_bytes", "spans", "unread_requests", "downstream_errors"):
        setattr(copied, name, dict(getattr(stats, name)))
    copied._latency = {protocol: copy.deepcopy(histogram) for protocol, histogram in stats.latency().items()}
    return copied


def choose_encoder(accept: str) -> tuple[Callable[[CollectorRegistry], bytes | Awaitable[bytes]], str]:
    """prometheus_client's ``choose_encoder``, for :func:`new_registry`'s registries: the same text
    (OpenMetrics, exemplars included, when the scraper asks for it, else the plain text format),
    the large metrics' kept between scrapes where their counts did not change. For such a registry
    the encoder copies the tallies and returns an awaitable of the text, rendered on a worker thread
    (``Detection.run`` awaits it in the detection queue)."""
    encode, content_type = exposition.choose_encoder(accept)
    return partial(_render, encode, content_type), content_type


def _render(
    encode: Callable[[Collector], bytes], content_type: str, registry: CollectorRegistry
) -> bytes | Awaitable[bytes]:
    """A registry of :func:`new_registry`: the tallies copied now, rendered on a worker thread
    (awaited); any other: rendered now."""
    if isinstance(registry, _Registry):
        return asyncio.to_thread(registry.collector.snapshot().render, encode, content_type)
    return encode(registry)


class _Registry(CollectorRegistry):
    """A registry of one :class:`ProcessorCollector`, which :func:`choose_encoder` renders."""

    def __init__(self, collector: ProcessorCollector) -> None:
        super().__init__(auto_describe=False)
        self.collector = collector
        self.register(collector)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def new_registry(detector: Tallies, stats: RequestStats) -> CollectorRegistry:
    """A registry holding only the processor's metrics (rendered by :func:`choose_encoder`)."""
    return _Registry(ProcessorCollector(detector, stats))
