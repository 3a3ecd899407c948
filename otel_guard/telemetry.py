"""Every attribute, event and metric name otel-guard writes, and the instruments that write them.

The names are the public contract (docs/spec.md §5): dashboards, alert rules and the collector-side
processor read them.

Metrics cost the hop almost nothing: each hop appends one key to a deque (:class:`HopTally`).
Decisions are reported by an observable counter when the SDK collects; the depths are recorded into
the histogram in that same collection callback (the SDK runs observable callbacks before it reads its
synchronous instruments), so a hop never pays for the histogram's aggregation and exemplar sampling
(measured: 17 % of a hop) nor for a lock. The price: the histogram has no exemplars.

The decision counter has them where they matter, for refusals and would-refuses: such a hop (rare)
also keeps the span context it was decided in, and the collection hands it to the SDK with its
count (``Observation(context=...)``). The SDK offers observable measurements to its exemplar
reservoir like any other, through ``OTEL_METRICS_EXEMPLAR_FILTER`` (``trace_based`` by default: a
sampled span only), so each refusing series carries the trace of its latest refusal.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import NonRecordingSpan, SpanContext

from otel_guard._prices import MICROS

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
COST_CURRENCY: Final = "cost_currency"
"""The spend metric's currency: ``cost_currency``'s ISO 4217 code."""
HOP_KIND: Final = "otel_guard.hop.kind"
"""``call`` or ``transfer`` (:attr:`otel_guard.chain.Hop.kind`)."""
ERROR_TYPE: Final = "error.type"

INVOKE_AGENT: Final = "invoke_agent"
EXECUTE_TOOL: Final = "execute_tool"

# What the conventions add to a hop's span where the runtime or the protocol knows it
# (docs/spec.md §5): the session, the remote agent's card, and the A2A and MCP request.
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_AGENT_DESCRIPTION: Final = "gen_ai.agent.description"
GEN_AI_AGENT_VERSION: Final = "gen_ai.agent.version"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
# A transfer's span (a handoff the runtime itself marks as one): the conventions' transfer mode.
GEN_AI_TRANSFER_MODE: Final = "gen_ai.transfer.mode"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
PASS_CONTROL: Final = "pass_control"
A2A_METHOD_NAME: Final = "a2a.method.name"
A2A_PROTOCOL_VERSION: Final = "a2a.protocol.version"
A2A_TENANT: Final = "a2a.tenant"
A2A_MESSAGE_ID: Final = "a2a.message.id"
A2A_REFERENCE_TASK_IDS: Final = "a2a.message.reference_task_ids"
A2A_TASK_ID: Final = "a2a.task.id"
A2A_TASK_STATE: Final = "a2a.task.state"
MCP_METHOD_NAME: Final = "mcp.method.name"
MCP_PROTOCOL_VERSION: Final = "mcp.protocol.version"
JSONRPC_REQUEST_ID: Final = "jsonrpc.request.id"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"

# Span events.
EVENT_REFUSED: Final = "otel_guard.refused"
EVENT_WOULD_REFUSE: Final = "otel_guard.would_refuse"
EVENT_MESSAGE: Final = "otel_guard.message"

# Metrics.
METRIC_DECISIONS: Final = "otel_guard.decisions"
METRIC_CHAIN_DEPTH: Final = "otel_guard.chain.depth"
METRIC_STORE_ERRORS: Final = "otel_guard.budget.store_errors"
METRIC_UNPRICED: Final = "otel_guard.budget.unpriced"
"""Counter: model responses no price covered while ``max_cost`` is on, by ``gen_ai.request.model``
[``otel_guard_budget_unpriced_total``]."""
METRIC_SPEND: Final = "otel_guard.budget.spend"
"""Counter: what priced model responses cost while ``max_cost`` is on, in units of the currency (a
list-price estimate), by ``cost_currency`` and ``gen_ai.request.model``
[``otel_guard_budget_spend_total``]."""
METRIC_STORE_EVICTIONS: Final = "otel_guard.budget.store_evictions"
"""Counter: tree counts the memory budget store dropped before they expired, to stay within its bound
(:data:`otel_guard.budget.memory.MAX_ENTRIES`) [``otel_guard_budget_store_evictions_total``]."""

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
    memory stays bounded when nothing ever collects) and at each collection. A hop that is not
    allowed also keeps, per decision key, the span context it was decided in (one dict store, atomic
    too): the exemplar of its series.
    """

    FOLD_AT = 1024

    def __init__(self) -> None:
        self._pending: deque[HopKey] = deque()
        self._lock = threading.Lock()
        self._decisions: dict[DecisionKey, int] = {}  # cumulative
        self._depths: dict[int, int] = {}  # since the last take_depths()
        self._refused_in: dict[DecisionKey, SpanContext] = {}  # the latest, per key not "allow"

    def add(self, key: HopKey, span: trace.Span | None = None) -> None:
        """One hop decided; a refusal or would-refuse also notes ``span``'s context (the hop's own
        span when given, else the current span: the one the hop was called from)."""
        pending = self._pending
        pending.append(key)
        if key[0][0] != "allow":
            span_context = (span if span is not None else trace.get_current_span()).get_span_context()
            if span_context.is_valid:
                self._refused_in[key[0]] = span_context
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

    def refused_in(self) -> dict[DecisionKey, SpanContext]:
        """Per decision key other than ``allow``, the span context of its latest hop."""
        return self._refused_in.copy()

    def take_depths(self) -> list[tuple[int, int]]:
        """Every depth with its count since the last call."""
        self._fold()
        with self._lock:
            depths, self._depths = self._depths, {}
        return list(depths.items())


class SpendTally:
    """What priced model responses cost, in integer micro-units by (currency, model), since the start.

    A response adds its cost under a lock (uncontended: one dict update); the SDK reads the sums when
    it collects, each as one float in units of the currency. Measured: the SDK counter's ``add`` with
    two attributes in a sampled span (its exemplar offered) cost 83 k instructions a response, more
    than pricing it; and a sum kept in integers is exact, where a float counter adds rounding errors.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._micros: dict[tuple[str, str], int] = {}

    def add(self, cost: int, currency: str, model: str) -> None:
        """``cost`` micro-units of ``currency`` spent on ``model``."""
        key = (currency, model)
        with self._lock:
            self._micros[key] = self._micros.get(key, 0) + cost

    def observe(self, _options: CallbackOptions) -> Iterator[Observation]:
        with self._lock:
            spent = list(self._micros.items())
        for (currency, model), micros in spent:
            yield Observation(micros / MICROS, {COST_CURRENCY: currency, GEN_AI_REQUEST_MODEL: model})


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
        self.unpriced = meter.create_counter(
            METRIC_UNPRICED,
            unit="{response}",
            description="Model responses no price covered while max_cost is on, by model",
        )
        self.spend = SpendTally()
        meter.create_observable_counter(
            METRIC_SPEND,
            callbacks=[self.spend.observe],
            unit="{currency}",
            description="What priced model responses cost while max_cost is on, in units of cost_currency "
            "(a list-price estimate, not a bill), by currency and model",
        )
        meter.create_observable_counter(
            METRIC_STORE_EVICTIONS,
            callbacks=[_observe_evictions],
            unit="{count}",
            description="Tree counts the memory budget store dropped before they expired, to stay "
            "within its bound",
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
        refused_in = self.hops.refused_in()
        for key, count in self.hops.decisions():
            decision, reason, name_key, name = key
            attributes = {DECISION: decision, name_key: name}
            if reason is not None:
                attributes[REASON] = reason
            span_context = refused_in.get(key)
            if span_context is None:
                yield Observation(count, attributes)
            else:
                # The exemplar's trace and span: the SDK reads them from the observation's context.
                where = trace.set_span_in_context(NonRecordingSpan(span_context))
                yield Observation(count, attributes, where)


def count_store_error(exc: BaseException) -> None:
    """One budget check that could not reach its store, or found no count under a key
    (``otel_guard.budget.store_errors``): by the error's ``error_type`` if it has one (a budget
    store's error: ``StoreError``, ``bad_value``, ...), else its class name."""
    error_type = getattr(exc, "error_type", None)
    if not isinstance(error_type, str):
        error_type = type(exc).__qualname__
    current().store_errors.add(1, {ERROR_TYPE: error_type})


def count_unpriced(model: str) -> None:
    """One model response no price covered (``otel_guard.budget.unpriced``)."""
    current().unpriced.add(1, {GEN_AI_REQUEST_MODEL: model})


def count_spend(cost: int, currency: str, model: str) -> None:
    """What one priced model response cost, ``cost`` micro-units of ``currency``
    (``otel_guard.budget.spend``, in units of the currency)."""
    current().spend.add(cost, currency, model)


_evictions = 0
_evictions_lock = threading.Lock()


def count_store_eviction() -> None:
    """One tree count the memory store dropped (``otel_guard.budget.store_evictions``): a number of
    the process, observed by the telemetry in force (so a drop is cheap where it happens)."""
    global _evictions
    with _evictions_lock:
        _evictions += 1
    current()  # the telemetry, and its observer, exist from the first drop


def _observe_evictions(_options: CallbackOptions) -> Iterator[Observation]:
    yield Observation(_evictions)


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
