"""The processor's compiled engine, as the rest of the package imports it.

The engine is a Rust extension (``otel_guard_processor._engine``, built by maturin from
processor/src/); this module names what it offers and, where it was never built (a source tree on
``sys.path``), fails on import saying how to build it rather than with a bare missing-module error.
Its calls take a whole request's bytes: no Python runs per span.

- :class:`Engine`: the whole detection in bounded state; ``ingest(request, now)``, ``expire(now)``,
  ``release_trees()`` and ``drain()`` (at stop: every waiting count made) each hand back the
  :class:`Events` they counted.
- :class:`EngineDetector`: an Engine behind the tallies the metrics read; the service's detector.
- :func:`check` ``(request)``: the spans of a request, or the :class:`DecodeError` ``ingest`` would
  raise for it (it decodes as ``ingest`` does, keeping nothing).
- :func:`decode_counts` ``(request, keys)``: the spans, links and asked-for attributes a request
  holds; :func:`decode_summary` ``(request, keys)``: what the engine reads of a request as Python
  values, for tests and benchmarks; :func:`dialect_table`: the table the engine reads calls by.
- :class:`DecodeError` (a ``ValueError``): the bytes are not a readable OTLP
  ExportTraceServiceRequest; the message says at which byte, in which message, and why.
- :class:`EngineFault` (a ``RuntimeError``): the engine failed, a bug, never the input's fault
  (a Rust panic, caught before it reaches Python); the request is to be refused, nothing else, and
  the engine starts again empty.

What a reader would not guess: counts that later spans may change are made late. A tool call's
edge waits ``tool_edge_wait`` seconds (an agent run below it may take its place), a loop's count
``cycle_wait`` (an earlier return may name it), both made by the first call into the engine after
their wait (in the same ``ingest`` when the wait is 0), or when their trace goes. The service sets
both to its one ``count_wait``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import TypeVar

from otel_guard_processor.bounds import MAX_SERIES, OVERFLOW, TREE_HOPS_BUCKETS, CountedCycle, DetectorLimits
from otel_guard_processor.dialects_file import Spec

try:
    from otel_guard_processor._engine import (
        DecodeError,
        Engine,
        EngineFault,
        Events,
        check,
        decode_counts,
        decode_summary,
        dialect_table,
    )
except ImportError as exc:
    raise ImportError(
        f"otel_guard_processor's compiled engine is not built ({exc}); from a checkout, build it with "
        "pip install -e ./processor (it needs a Rust toolchain: https://rustup.rs)"
    ) from exc

__all__ = [
    "DecodeError",
    "Engine",
    "EngineDetector",
    "EngineFault",
    "Events",
    "SpanAt",
    "check",
    "decode_counts",
    "decode_summary",
    "dialect_table",
]

K = TypeVar("K")


SpanAt = tuple[bytes, bytes, float]
"""A span a count points at: its trace id and span id as sent (unchecked), and when it was counted
(seconds since the epoch)."""


class EngineDetector:
    """An :class:`Engine` and the tallies of what it counted, as the metrics read them.

    ``cycles[(kind, label)]``, ``delegations[(caller, callee)]``,
    ``decisions[(decision, reason, name)]`` (each at most ``MAX_SERIES`` label sets, the rest under
    ``_overflow``), ``evictions[reason]``, ``dropped[reason]``, ``duplicates``,
    ``truncated[what]``, ``tree_hops`` (per bucket of ``TREE_HOPS_BUCKETS``), ``tree_hops_sum``,
    ``tree_evictions[reason]``; ``cycle_spans[(kind, label)]``: the span where the name returned in
    the latest count of that cycle, ``cycle_roots[(kind, label)]``: that count's chain root (or
    None), ``decision_spans[(decision, reason, name)]``: the latest span
    of that decision whose ids are the size of real ones. ``on_cycle`` is told of each cycle
    counted, under its series. ``dialects``: a dialects file's rows (``--dialects``), read after the
    built-in table's. Python runs once a call, never once a span.
    """

    def __init__(
        self,
        limits: DetectorLimits | None = None,
        *,
        on_cycle: Callable[[CountedCycle], None] | None = None,
        clock: Callable[[], float] = time.time,
        dialects: Sequence[Spec] = (),
    ) -> None:
        self.limits = limits or DetectorLimits()
        self.engine = Engine(
            dialects=list(dialects),
            max_traces=self.limits.max_traces,
            max_spans=self.limits.max_spans,
            max_spans_per_trace=self.limits.max_spans_per_trace,
            max_held_bytes=self.limits.max_held_bytes,
            trace_ttl=self.limits.trace_ttl,
            tool_edge_wait=self.limits.count_wait,
            cycle_wait=self.limits.count_wait,
        )
        # Checks a request on the event loop while detection borrows the engine on a worker.
        self._checker = self.engine.checker()
        self._on_cycle = on_cycle
        self._clock = clock
        self.cycles: dict[tuple[str, str], int] = {}
        self.cycle_spans: dict[tuple[str, str], SpanAt] = {}
        self.cycle_roots: dict[tuple[str, str], str | None] = {}
        self.delegations: dict[tuple[str, str], int] = {}
        self.decisions: dict[tuple[str, str, str], int] = {}
        self.decision_spans: dict[tuple[str, str, str], SpanAt] = {}
        self.evictions: dict[str, int] = {"ttl": 0, "capacity": 0}
        self.dropped: dict[str, int] = {"trace_full": 0}
        self.duplicates = 0
        self.truncated: dict[str, int] = {"name": 0, "label": 0}
        self.tree_hops: list[int] = [0] * (len(TREE_HOPS_BUCKETS) + 1)
        self.tree_hops_sum = 0
        self.tree_evictions: dict[str, int] = {"ttl": 0, "capacity": 0}

    @property
    def active_traces(self) -> int:
        return self.engine.active_traces

    @property
    def active_trees(self) -> int:
        return self.engine.active_trees

    @property
    def stored_spans(self) -> int:
        return self.engine.stored_spans

    @property
    def pending_spans(self) -> int:
        return self.engine.pending_spans

    @property
    def held_bytes(self) -> int:
        """The bytes the held traces weigh, as the engine reckons them (``max_held_bytes``)."""
        return self.engine.held_bytes

    @property
    def delegating_traces(self) -> int:
        """Held traces with a delegation path of two names or more: evicted after the others."""
        return self.engine.delegating_traces

    def check(self, raw: bytes) -> int:
        """The spans of a request, or the :class:`DecodeError` :meth:`ingest` would raise for it
        (:func:`check` with the keys of this detector's dialects file too), keeping nothing; safe
        while :meth:`ingest` runs on another thread."""
        return self._checker.check(raw)

    def ingest(self, raw: bytes, now: float) -> int:
        """Read one request (its protobuf bytes) received at ``now``; return how many spans it had.
        Raises :class:`DecodeError` (nothing changed) or :class:`EngineFault`."""
        events = self.engine.ingest(raw, now)
        self._tally(events)
        return events.received

    def expire(self, now: float) -> int:
        """Evict the traces idle for longer than the TTL and make the counts whose wait is over;
        return how many traces went."""
        events = self.engine.expire(now)
        self._tally(events)
        return events.evictions["ttl"]

    def count_waiting(self, now: float) -> None:
        """Make every count still waiting, as if its wait were over (the processor stops: no later
        span can change them); traces idle for longer than the TTL less the wait go too."""
        self.expire(now + self.limits.count_wait)

    def drain(self) -> None:
        """Make every count still waiting, settling the spans still waiting for their parent or
        linked span as if their trace went, and let go of every trace and tree (the processor stops:
        no later span can change a count)."""
        self._tally(self.engine.drain())

    def release_trees(self) -> int:
        """Let go of every tree held (the processor stops), each observed once; return how many."""
        events = self.engine.release_trees()
        self._tally(events)
        return len(events.tree_hops)

    def _tally(self, events: Events) -> None:
        cycles = events.cycles
        when = self._clock() if cycles or events.decision_spans else 0.0
        for (kind, label, trace_id, span_id), root in zip(cycles, events.cycle_roots, strict=True):
            key = _count(self.cycles, (kind, label), (kind, OVERFLOW), 1)
            self.cycle_spans[key] = (trace_id, span_id, when)
            self.cycle_roots[key] = root
            if self._on_cycle is not None:
                self._on_cycle(CountedCycle(key[0], key[1], trace_id, span_id, root))
        for edge, count in events.delegations.items():
            _count(self.delegations, edge, (OVERFLOW, OVERFLOW), count)
        spans = events.decision_spans
        for decision, count in events.decisions.items():
            series = _count(self.decisions, decision, (OVERFLOW, OVERFLOW, OVERFLOW), count)
            at = spans.get(decision)
            if at is not None:
                self.decision_spans[series] = (*at, when)
        for hops in events.tree_hops:
            self.tree_hops[bisect_left(TREE_HOPS_BUCKETS, hops)] += 1
            self.tree_hops_sum += hops
        for reason, count in events.evictions.items():
            self.evictions[reason] += count
        for reason, count in events.tree_evictions.items():
            self.tree_evictions[reason] += count
        for what, count in events.truncated.items():
            self.truncated[what] += count
        self.dropped["trace_full"] += events.dropped
        self.duplicates += events.duplicates


def _count(tally: dict[K, int], key: K, overflow: K, by: int) -> K:
    """Add to a metric's tally, folding new label sets past MAX_SERIES into ``overflow``; the key
    counted."""
    if key not in tally and len(tally) >= MAX_SERIES:
        key = overflow
    tally[key] = tally.get(key, 0) + by
    return key
