"""The processor's compiled engine, as the rest of the package imports it.

The engine is a Rust extension (``otel_guard_processor._engine``, built by maturin from
processor/src/); this module names what it offers and, where it was never built (a source tree on
``sys.path``), fails on import saying how to build it rather than with a bare missing-module error.
Its calls take a whole request's bytes: no Python runs per span.

- :class:`Engine`: the whole detection in bounded state; ``ingest(request, now)``, ``expire(now)``
  and ``release_trees()`` each hand back the :class:`Events` they counted.
- :class:`EngineDetector`: an Engine behind the tallies the metrics read (the attributes of
  :class:`~otel_guard_processor.detector.Detector`), for the service to switch over to.
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
``cycle_wait`` (an earlier return may name it), both made by the :meth:`Engine.expire` after their
wait, or when their trace goes.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TypeVar

from otel_guard_processor.detector import MAX_SERIES, OVERFLOW, TREE_HOPS_BUCKETS, DetectorLimits

try:
    from otel_guard_processor._engine import (
        DecodeError,
        Engine,
        EngineFault,
        Events,
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
    "decode_counts",
    "decode_summary",
    "dialect_table",
]

K = TypeVar("K")


class EngineDetector:
    """An :class:`Engine` and the tallies of what it counted, as the metrics read a Detector's.

    ``cycles[(kind, label)]``, ``delegations[(caller, callee)]``,
    ``decisions[(decision, reason, name)]`` (each at most ``MAX_SERIES`` label sets, the rest under
    ``_overflow``), ``evictions[reason]``, ``dropped[reason]``, ``duplicates``,
    ``truncated[what]``, ``tree_hops`` (per bucket of ``TREE_HOPS_BUCKETS``), ``tree_hops_sum``,
    ``tree_evictions[reason]``; ``exemplars[(kind, label)]``: the (trace id, span id), in hex, of
    the span where the name returned in the latest count of that cycle.
    """

    def __init__(self, limits: DetectorLimits | None = None, *, cycle_wait: float | None = None) -> None:
        self.limits = limits or DetectorLimits()
        wait = self.limits.tool_edge_wait if cycle_wait is None else cycle_wait
        self.engine = Engine(
            max_traces=self.limits.max_traces,
            max_spans=self.limits.max_spans,
            max_spans_per_trace=self.limits.max_spans_per_trace,
            trace_ttl=self.limits.trace_ttl,
            tool_edge_wait=self.limits.tool_edge_wait,
            cycle_wait=wait,
        )
        self.cycles: dict[tuple[str, str], int] = {}
        self.exemplars: dict[tuple[str, str], tuple[str, str]] = {}
        self.delegations: dict[tuple[str, str], int] = {}
        self.decisions: dict[tuple[str, str, str], int] = {}
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

    def release_trees(self) -> int:
        """Let go of every tree held (the processor stops), each observed once; return how many."""
        events = self.engine.release_trees()
        self._tally(events)
        return len(events.tree_hops)

    def _tally(self, events: Events) -> None:
        for kind, label, trace_id, span_id in events.cycles:
            key = _count(self.cycles, (kind, label), (kind, OVERFLOW), 1)
            self.exemplars[key] = (trace_id.hex(), span_id.hex())
        for edge, count in events.delegations.items():
            _count(self.delegations, edge, (OVERFLOW, OVERFLOW), count)
        for decision, count in events.decisions.items():
            _count(self.decisions, decision, (OVERFLOW, OVERFLOW, OVERFLOW), count)
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
