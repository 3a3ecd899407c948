"""Every attribute, event and metric name otel-guard writes, and the instruments that write them.

The names are the public contract (CONTRACT §5): dashboards, alert rules and the collector-side
processor read them.

Metrics cost the hop almost nothing: each hop appends one key to a deque (:class:`HopTally`).
Decisions are reported by an observable counter when the SDK collects; the depths are recorded into
the histogram in that same collection callback (the SDK runs observable callbacks before it reads its
synchronous instruments), so a hop never pays for the histogram's aggregation and exemplar sampling
(measured: 17 % of a hop) nor for a lock. The price: the histogram has no exemplars.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Final

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
BUDGET_HOPS: Final = "otel_guard.budget.hops"
BUDGET_EXHAUSTED: Final = "otel_guard.budget.exhausted"
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
METRIC_STORE_ERRORS: Final = "otel_guard.budget.store_errors"

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

HopKey = tuple[DecisionKey, int]
"""What one hop reports: its decision key and its chain depth."""


class HopTally:
    """The hops decided since the start (by decision) and since the last collection (by depth).

    A hop only appends its key to a deque: ``deque.append`` is atomic, so hops on many threads take
    no lock. The keys are folded into counts under a lock, by whichever hop finds the deque long (so
    memory stays bounded when nothing ever collects) and at each collection.
    """

    FOLD_AT = 1024

    def __init__(self) -> None:
        self._pending: deque[HopKey] = deque()
        self._lock = threading.Lock()
        self._decisions: dict[DecisionKey, int] = {}  # cumulative
        self._depths: dict[int, int] = {}  # since the last take_depths()

    def add(self, key: HopKey) -> None:
        pending = self._pending
        pending.append(key)
        if len(pending) >= self.FOLD_AT:
            self._fold()

    def _fold(self) -> None:
        with self._lock:
            pending, decisions, depths = self._pending, self._decisions, self._depths
            # Only what is there now: keys appended meanwhile stay for the next fold, none is lost.
            for _ in range(len(pending)):
                decision, depth = pending.popleft()
                decisions[decision] = decisions.get(decision, 0) + 1
                depths[depth] = depths.get(depth, 0) + 1

    def decisions(self) -> list[tuple[DecisionKey, int]]:
        """Every decision key with its count since the start."""
        self._fold()
        with self._lock:
            return list(self._decisions.items())

    def take_depths(self) -> list[tuple[int, int]]:
        """Every depth with its count since the last call."""
        self._fold()
        with self._lock:
            depths, self._depths = self._depths, {}
        return list(depths.items())


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
        self.hops = HopTally()
        self._depth_histogram = meter.create_histogram(
            METRIC_CHAIN_DEPTH,
            unit="{hop}",
            description="Delegation chain depth at each hop, this hop included",
            explicit_bucket_boundaries_advisory=list(DEPTH_BUCKETS),
        )
        self.store_errors = meter.create_counter(
            METRIC_STORE_ERRORS,
            unit="{error}",
            description="Budget checks that could not reach their store, by error type",
        )
        meter.create_observable_counter(
            METRIC_DECISIONS,
            callbacks=[self._collect],
            unit="{decision}",
            description="Delegation hops decided by otel-guard, by decision, reason and agent or tool",
        )

    def _collect(self, _options: CallbackOptions) -> Iterable[Observation]:
        record = self._depth_histogram.record
        for depth, count in self.hops.take_depths():
            for _ in range(count):
                record(depth)
        for (decision, reason, name_key, name), count in self.hops.decisions():
            attributes = {DECISION: decision, name_key: name}
            if reason is not None:
                attributes[REASON] = reason
            yield Observation(count, attributes)


def count_store_error(exc: BaseException) -> None:
    """One budget check that could not reach its store, or found no count under a key
    (``otel_guard.budget.store_errors``): by the error's ``error_type`` if it has one (a budget
    store's error: ``StoreError``, ``bad_value``, ...), else its class name."""
    error_type = getattr(exc, "error_type", None)
    if not isinstance(error_type, str):
        error_type = type(exc).__qualname__
    current().store_errors.add(1, {ERROR_TYPE: error_type})


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
