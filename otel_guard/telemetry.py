"""Every attribute, event and metric name otel-guard writes, and the instruments that write them.

The names are the public contract (CONTRACT §5): dashboards, alert rules and the collector-side
processor read them.

Metrics cost the hop almost nothing: decisions and depths are tallied in dicts. Decisions are
reported by an observable counter when the SDK collects; the depths are recorded into the histogram
in that same collection callback (the SDK runs observable callbacks before it reads its
synchronous instruments), so a hop never pays for the histogram's aggregation and exemplar sampling
(measured: 17 % of a hop). The price: the histogram has no exemplars.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

CHAIN_BAGGAGE_KEY: Final = "otel_guard.chain"

# Span attributes (GenAI semantic conventions, then ours).
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
SKILL: Final = "otel_guard.skill"
CHAIN_AGENTS: Final = "otel_guard.chain.agents"
CHAIN_SKILLS: Final = "otel_guard.chain.skills"
CHAIN_ROOT: Final = "otel_guard.chain.root"
CHAIN_DEPTH: Final = "otel_guard.chain.depth"
NAME_DEPTH: Final = "otel_guard.name_depth"
DECISION: Final = "otel_guard.decision"
REASON: Final = "otel_guard.reason"
MODE: Final = "otel_guard.mode"
ERROR_TYPE: Final = "error.type"

INVOKE_AGENT: Final = "invoke_agent"
EXECUTE_TOOL: Final = "execute_tool"

# Span events.
EVENT_REFUSED: Final = "otel_guard.refused"
EVENT_WOULD_REFUSE: Final = "otel_guard.would_refuse"
EVENT_MESSAGE: Final = "otel_guard.message"

# Metrics.
METRIC_DECISIONS: Final = "otel_guard.decisions"
METRIC_CHAIN_DEPTH: Final = "otel_guard.chain.depth"

INSTRUMENTATION_NAME: Final = "otel_guard"
DEPTH_BUCKETS: Final = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("otel-guard")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0"


DecisionKey = tuple[str, str | None, str, str]
"""(decision, reason, name attribute key, name)."""


class Tally:
    """Counts kept in a dict behind a lock, taken out at collection time."""

    def __init__(self) -> None:
        self._counts: dict[Any, int] = {}
        self._lock = threading.Lock()

    def add(self, key: Any) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> list[tuple[Any, int]]:
        with self._lock:
            return list(self._counts.items())

    def take(self) -> list[tuple[Any, int]]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return list(counts.items())


class Telemetry:
    """The tracer and instruments of one (tracer provider, meter provider) pair."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        version = _version()
        self.tracer = trace.get_tracer(INSTRUMENTATION_NAME, version, tracer_provider)
        meter = metrics.get_meter(INSTRUMENTATION_NAME, version, meter_provider)
        self.decisions = Tally()  # DecisionKey -> count, cumulative
        self.depths = Tally()  # depth -> hops since the last collection
        self._depth_histogram = meter.create_histogram(
            METRIC_CHAIN_DEPTH,
            unit="{hop}",
            description="Delegation chain depth at each hop, this hop included",
            explicit_bucket_boundaries_advisory=list(DEPTH_BUCKETS),
        )
        meter.create_observable_counter(
            METRIC_DECISIONS,
            callbacks=[self._collect],
            unit="{decision}",
            description="Delegation hops decided by otel-guard, by decision, reason and agent or tool",
        )

    def _collect(self, _options: CallbackOptions) -> Iterable[Observation]:
        record = self._depth_histogram.record
        for depth, count in self.depths.take():
            for _ in range(count):
                record(depth)
        for (decision, reason, name_key, name), count in self.decisions.snapshot():
            attributes = {DECISION: decision, name_key: name}
            if reason is not None:
                attributes[REASON] = reason
            yield Observation(count, attributes)


_telemetry: Telemetry | None = None
_telemetry_lock = threading.Lock()
_by_providers: dict[tuple[object, object], Telemetry] = {}


def current() -> Telemetry:
    """The telemetry in force: the global providers', made on first use, unless :func:`bind` chose."""
    telemetry = _telemetry
    return telemetry if telemetry is not None else bind()


def bind(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Telemetry:
    """Send otel-guard's spans and metrics to these providers (the global ones when ``None``).

    Binding to the same providers again reuses their telemetry: a meter hands back the instrument it
    already made for a name and ignores a second callback, so new instruments would record nowhere.
    """
    global _telemetry
    key = (tracer_provider, meter_provider)
    with _telemetry_lock:
        telemetry = _by_providers.get(key)
        if telemetry is None:
            telemetry = _by_providers[key] = Telemetry(tracer_provider, meter_provider)
        _telemetry = telemetry
    return telemetry


@contextmanager
def bound(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Iterator[Telemetry]:
    """Within the block, send otel-guard's spans and metrics to these providers; then restore."""
    global _telemetry
    previous = _telemetry
    try:
        yield bind(tracer_provider, meter_provider)
    finally:
        _telemetry = previous
