"""The bounds of detection: the limits the engine runs with, and those of the metrics it feeds.

:class:`DetectorLimits` holds what the operator sets (``--max-traces`` and the rest); the other
names are fixed: label sets a metric keeps (``MAX_SERIES``, the rest under ``OVERFLOW``), how long
the engine keeps a name, a cycle label and a path (``MAX_NAME_CHARS``, ``MAX_LABEL_CHARS``,
``MAX_PATH_NAMES``, the engine's own: processor/src/graph/limits.rs), the tree-hops buckets.

What a reader would not guess: ``count_wait`` is how long a count waits for late spans that may
change it (an earlier return that names a loop, an agent run that takes a tool call's place); the
engine makes a count that long after the span that made it due, and at once when it is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

__all__ = [
    "CUT",
    "MAX_HELD_BYTES",
    "MAX_LABEL_CHARS",
    "MAX_NAME_CHARS",
    "MAX_PATH_NAMES",
    "MAX_SERIES",
    "OVERFLOW",
    "TREE_HOPS_BUCKETS",
    "CountedCycle",
    "DetectorLimits",
]

MAX_PATH_NAMES: Final = 64
# The default of --max-held-bytes: the bytes of detection state all held traces may reckon to
# (docs/processor.md says why 256 MiB, and what the processor's RSS comes to with it).
MAX_HELD_BYTES: Final = 256 * 1024 * 1024
# Names and label values come from what senders put in spans: a name is cut to MAX_NAME_CHARS and a
# cycle label to MAX_LABEL_CHARS, the cut shown by a last character "…" (counted in ``truncated``).
MAX_NAME_CHARS: Final = 256
MAX_LABEL_CHARS: Final = 1024
CUT: Final = "…"
# Upper bounds of the tree-hops histogram's buckets: around the guard's default max_hops (1000).
TREE_HOPS_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
# Label values come from span names and attributes, which the senders choose: each metric keeps at
# most MAX_SERIES label sets, and counts the rest under the label value OVERFLOW.
MAX_SERIES: Final = 10_000
OVERFLOW: Final = "_overflow"


class CountedCycle(NamedTuple):
    """A cycle as it was just counted: its series (``cycle`` is ``OVERFLOW`` once the metric holds
    MAX_SERIES label sets), the span where the name returned, by its trace and span id as sent
    (opaque bytes, unchecked), and the ``otel_guard.chain.root`` its trace's guard spans name (the
    id that finds the loop's other traces), or None."""

    kind: str
    cycle: str
    trace_id: bytes
    span_id: bytes
    chain_root: str | None = None


@dataclass(frozen=True)
class DetectorLimits:
    """The bounds on detection state, and the wait of a count (see the module docstring)."""

    max_traces: int = 50_000
    max_spans: int = 1_000_000
    max_spans_per_trace: int = 10_000
    max_held_bytes: int = MAX_HELD_BYTES
    trace_ttl: float = 120.0
    count_wait: float = 10.0
