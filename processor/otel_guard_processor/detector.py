"""Finding delegation cycles in a stream of spans, incrementally and in bounded memory.

What counts
-----------
A *call span* is an agent run or a tool call, in whichever dialect it is written: the OpenTelemetry
GenAI conventions, OpenInference or OpenLLMetry (:mod:`otel_guard_processor.dialects` says which
spans are calls and what they are named; the detector knows no dialect). Every other span -- HTTP
client and server spans, model calls, graph nodes -- is an unnamed link in the ancestry.

Each span's *path* is the list of names of its named ancestors, oldest first. A *cycle* is a name
that is already on its own path. Its label is the path from that name's latest earlier occurrence
to the repeat (``planner>budget>planner``). Its kind:

- ``cross_trace``: the cycle's path crosses into another trace, through a span link or through a
  chain carried by ``otel_guard.chain.*`` attributes;
- ``direct``: nothing named stands between the two occurrences (A -> A, perhaps through HTTP spans);
- ``cross_function``: other names stand between (A -> B -> A).

One loop is one series: a loop that bounces many times in one trace counts once, under the label of
the first name that returned; its later turns (``budget>planner>budget``, a rotation of the same
names) count nothing more. Each distinct (kind, label) counts once per trace, in the trace of the
span that repeats the name.

One call is one hop
-------------------
however many spans record it. An agent run below a tool call (nothing named between) is the run of
that tool: the tool's name gives way to the agent's on the path, so paths, labels and edges are in
agent names (a tool that runs an agent makes the edge caller -> agent, and no edge to the tool).
A named span directly below a span of the same name is the same call when it is

- the server side of a remote call below its client side (CLIENT or PRODUCER above, SERVER or
  CONSUMER below);
- another instrumentation's span of the call (another scope), or the guard's span of a call that
  another instrumentation recorded first (``otel_guard.name_depth`` 1);
- a wrapper of the same instrumentation read by another dialect rule (Traceloop's
  ``invoke_agent X`` around ``X.workflow``).

It is a new call, and a ``direct`` cycle, when the same instrumentation records it in the same form
(``invoke_agent wiki_agent`` inside ``invoke_agent wiki_agent``), when an agent calls a tool named
after itself, and when the inline guard's span says its chain already held the name
(``otel_guard.name_depth`` of 2 or more).

``delegations`` counts one per call, on the edge from its nearest named ancestor; a call with no
named ancestor starts a path and has no edge. Beside the inline guard, another instrumentation may
record the same calls in spans that stand beside the guard's rather than above or below them (it
parents by its runtime's own run tree): per path of names in a trace, the edge counts the larger of
the calls the guard's spans recorded there and the calls the other spans did. A tool's edge waits
``tool_edge_wait`` seconds (counted by :meth:`Detector.expire`, which the service calls every
second) so that an agent run below it can take its place: such a run usually comes first (spans are
exported as they end), but from another process it may come after.

Across traces
-------------
A span that starts a trace (it has no parent) continues the path of

- the chain it carries, when the inline guard put one on it (``otel_guard.chain.agents`` with more
  than one hop: the earlier hops, identified by the shared ``otel_guard.chain.root``, are its
  ancestors), else
- its first span link (the OpenTelemetry pattern for work handed over through a queue), waiting for
  the linked span if it has not arrived yet.

Order, duplicates and bounds
----------------------------
Spans arrive in any order and in any request. A span whose parent has not arrived waits for it, and
is settled -- with all its waiting descendants -- the moment the parent arrives. A span whose parent
never arrives is settled when its trace is evicted -- on the chain it carries if the guard made it,
else as a root: the wait is bounded by the trace TTL.
A span seen twice (a retried request) is not counted twice while its trace is held.

State is bounded: at most ``max_traces`` traces, ``max_spans`` spans in all and
``max_spans_per_trace`` per trace (checked as each request starts on a trace, so one request may
overshoot it by its own spans), each trace dropped ``trace_ttl`` seconds after its last span.
Traces are evicted least recently active first and counted in ``evictions`` by reason; spans left
out because their trace is full are counted in ``dropped``. Paths keep their last
``MAX_PATH_NAMES`` names.

Reading is lazy, because this runs once per span at line rate. A call span named in the GenAI form
is read by its span name, its side from its kind. Attributes are read only when they are needed:
for spans of scopes that name calls otherwise (and only in requests that hold a dialect's marker
bytes at all; those spans are searched in the bytes they were received as,
:func:`otel_guard_processor.otlp.parse_encoded_spans`), for a repeat directly under the same name,
for a span that starts a trace or has to wait for its parent (and of the guard's attributes, only
on spans that hold ``otel_guard.`` bytes). Decisions are counted from the raw request when every
``otel_guard.decision`` in it is ``allow`` and their number is that of the guard's call spans, and
read span by span otherwise; the counts, and the check for tree hop counts, read the guard's spans'
own bytes where spans of other scopes share the request (a Collector's batches put them between
the guard's), else the request between its first and its last ``otel_guard.``. Ids are read as
opaque keys and not checked: the request goes downstream unchanged, and a downstream that rejects
an id answers for it.

Delegation trees
----------------
Where the inline guard's tree budget is on, each hop's span carries ``otel_guard.budget.hops``: the
hops its delegation tree (``otel_guard.chain.root``) has used, this one included. The detector
keeps the largest count seen per root and observes it once per tree into ``tree_hops`` (buckets
``TREE_HOPS_BUCKETS``) when it lets go of the tree: ``trace_ttl`` seconds after the tree's latest
hop span, at capacity (as many trees as ``max_traces``, least recently active first, counted in
``tree_evictions`` by reason), and at :meth:`Detector.release_trees` (the processor's stop). A tree
idle for longer than the TTL that then goes on is observed again, as a new tree.

The counts are read from the bytes of the guard's spans (as above: the guard's spans' own bytes, or
the request between its first and last ``otel_guard.``), not span by span: a hop span's attributes
are not otherwise read when its decision is counted in bulk, and reading them would cost more than
the rest of the span's detection. Each ``otel_guard.budget.hops`` there (written key first or value
first) is paired with the ``otel_guard.chain.root`` before it since the previous count: the guard
writes the root before the count, and every span that carries a count carries its root. A request
with no count costs one search of those bytes (about 1 %
of the guarded traffic's detection, in instructions); one with counts, a split of its bytes and a
few slices a count (about 7,000 instructions a count: 17 % more on guarded traffic with the budget
on, four counts in 13 spans: the ``budget`` mix of ``bench/processor_instructions.py``).

The detector does no I/O and knows nothing of Prometheus or gRPC: it reads parsed requests
(:mod:`otel_guard_processor.otlp`) and tallies into plain dicts that the metrics module exposes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, overload

from otel_guard_processor.dialects import (
    AGENT,
    CALL_PREFIXES,
    CALLER_AGENT_NAME,
    FORM_NAME,
    MARKERS,
    TOOL,
    name_of_named_call,
    read_call,
)
from otel_guard_processor.otlp import (
    KIND_CLIENT,
    KIND_CONSUMER,
    KIND_PRODUCER,
    KIND_SERVER,
    Attributes,
    EncodedSpansView,
    RequestView,
    SpanView,
    _varint,
    attribute_key,
    encoded_attribute,
    parse_encoded_spans,
)

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_NAME_CHARS",
    "MAX_PATH_NAMES",
    "TREE_HOPS_BUCKETS",
    "CountedCycle",
    "Detector",
    "DetectorLimits",
]

MAX_PATH_NAMES: Final = 64
# Names and label values come from what senders put in spans: a name is cut to MAX_NAME_CHARS and a
# cycle label to MAX_LABEL_CHARS, the cut shown by a last character "…" (counted in ``truncated``).
MAX_NAME_CHARS: Final = 256
MAX_LABEL_CHARS: Final = 1024
CUT: Final = "…"

# A path is a tuple (boundary, last, name, name, ...), kept as a plain tuple of ints and strings
# because one exists for every named span: such tuples allocate once and the garbage collector
# stops tracking them, where an object per span would be scanned on every full collection.
# Unnamed spans share their parent's path object.
#   boundary: how many of the names lie before the latest crossing into this trace;
#   last:     the marker of the nearest named span (see below);
#   names:    the named ancestors, oldest first (the span's own name last when it is named).
# Names are strings and the two heads are ints, so `name in path` tests the names alone.
Path = tuple[int | str, ...]
_HEAD: Final = 2
ROOT_PATH: Final[Path] = (0, 0)

# A marker packs what the same-call rule needs of a named span, in bits: which side of a remote
# call it is (0-1), whether the inline guard made it (2), its call kind (3-4), the dialect form it
# was read by (5-7), whether it is a call only below a tool (8), its instrumentation scope (9-24),
# whether it is a caller named by its callee (25), and its otel_guard.name_depth when that has been
# read (26-; 0 when not read or absent).
_CLIENT: Final = 1
_SERVER: Final = 2
_GUARDED: Final = 4
_KIND_SHIFT: Final = 3
_FORM_SHIFT: Final = 5
_CONDITIONAL: Final = 1 << 8
_SCOPE_SHIFT: Final = 9
_SCOPE_MASK: Final = 0xFFFF
# A path entry that only a span's gen_ai.caller.agent.name put there: never the same call.
_CALLER_ENTRY: Final = 1 << 25
_NAME_DEPTH_SHIFT: Final = 26
_AGENT_BITS: Final = AGENT << _KIND_SHIFT
_TOOL_BITS: Final = TOOL << _KIND_SHIFT
_KIND_BITS: Final = 3 << _KIND_SHIFT
_FORM_BITS: Final = 7 << _FORM_SHIFT
_NAME_FORM_BITS: Final = FORM_NAME << _FORM_SHIFT
_SIDES: Final = {KIND_CLIENT: _CLIENT, KIND_PRODUCER: _CLIENT, KIND_SERVER: _SERVER, KIND_CONSUMER: _SERVER}
# The span-name prefixes: "invoke_agent " and "execute_tool " are as long; "invoke_workflow " is
# told from "invoke_agent " by its eighth character.
_PREFIX_LENGTH: Final = len(CALL_PREFIXES[0])
_WORKFLOW_PREFIX_LENGTH: Final = len(CALL_PREFIXES[2])
assert len(CALL_PREFIXES[1]) == _PREFIX_LENGTH
assert CALL_PREFIXES[2][7] == "w" != CALL_PREFIXES[0][7]

_GUARD_BYTES: Final = b"otel_guard."
_NAME_DEPTH: Final = attribute_key("otel_guard.name_depth")
_DEPTH: Final = attribute_key("otel_guard.chain.depth")
_DECISION_KEY: Final = attribute_key("otel_guard.decision")
_ALLOW: Final = encoded_attribute("otel_guard.decision", "allow")
_DECISION_FIELD: Final = _DECISION_KEY[:-1]
# A KeyValue written value first: the value field (tag 0x12, length, AnyValue), then the key field.
_ALLOW_VALUE_FIRST: Final = _ALLOW[len(_DECISION_KEY) - 1 :] + _DECISION_FIELD
_REASON: Final = attribute_key("otel_guard.reason")
_AGENTS: Final = attribute_key("otel_guard.chain.agents")
_CALLER: Final = CALLER_AGENT_NAME
# The tree budget's hop count and the tree it counts (see "Delegation trees" above): the key fields
# alone (tag, length, key), which a KeyValue holds in either field order.
_HOPS_FIELD: Final = attribute_key("otel_guard.budget.hops")[:-1]
# How far before its "otel_guard." a request's otel_guard.* key can start (a value written before
# its key: tag, length, AnyValue, then the key's tag and length), and past it end: more than both.
_GUARD_MARGIN: Final = 64
_ROOT_FIELD: Final = attribute_key("otel_guard.chain.root")[:-1]
_VALUE_TAG: Final = 0x12  # KeyValue.value
_INT_TAG: Final = 0x18  # AnyValue.int_value
_STRING_TAG: Final = 0x0A  # AnyValue.string_value
_GUARD_ROOT_CHARS: Final = 32  # the guard's roots: 32 hex characters
# The guard's layout, a root of 32 characters just before a count below 128, in either order.
_ONE_BYTE_COUNT: Final = bytes((_VALUE_TAG, 2, _INT_TAG))
_ROOT_VALUE_HEAD: Final = bytes((_VALUE_TAG, _GUARD_ROOT_CHARS + 2, _STRING_TAG, _GUARD_ROOT_CHARS))
_ROOT_KEY_FIRST: Final = _ROOT_FIELD + _ROOT_VALUE_HEAD
# Upper bounds of the tree-hops histogram's buckets: around the guard's default max_hops (1000).
TREE_HOPS_BUCKETS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
# The instrumentation scope of the inline guard's spans (otel_guard.telemetry.INSTRUMENTATION_NAME).
GUARD_SCOPE: Final = "otel_guard"
# How long a scope's habit of naming calls (by span name alone, or also otherwise) is trusted
# before a whole request from it is checked again.
SCOPE_RECHECK_SECONDS: Final = 600.0
SCOPE_LEARN_REQUESTS: Final = 16
_MAX_SCOPES: Final = 1024
_MAX_SCOPE_IDS: Final = _SCOPE_MASK
_MAX_MARKERS: Final = 4096  # distinct marker values kept one object of (name depths are the senders')
# Label values come from span names and attributes, which the senders choose: each metric keeps at
# most MAX_SERIES label sets, and counts the rest under the label value OVERFLOW.
MAX_SERIES: Final = 10_000
OVERFLOW: Final = "_overflow"
_OVERFLOW_EDGE: Final = (OVERFLOW, OVERFLOW)
_OVERFLOW_DECISION: Final = (OVERFLOW, OVERFLOW, OVERFLOW)
# _Trace.calls packs two counts in one int: the guard's spans' calls below _OTHERS, the others' above.
_OTHERS: Final = 32
_GUARDS: Final = (1 << _OTHERS) - 1

# A span that waits for its parent (or, for a trace root, for the span it links to). A plain tuple
# because spans wait often -- a batch usually holds children before their parents -- and fields by
# index: trace id, span id, parent span id (b"" for a linked trace root), name (None when unnamed),
# marker, decision ((decision, reason, name) from otel_guard.decision, or None), and the path of
# the guard's chain before it (for a guard span that may turn out an orphan), or None.
Waiter = tuple[bytes, bytes, bytes, str | None, int, tuple[str, str, str] | None, "Path | None"]
_TRACE_ID: Final = 0
_SPAN_ID: Final = 1
_PARENT_ID: Final = 2
_NAME: Final = 3
_MARKER: Final = 4
_DECISION: Final = 5
_CHAIN: Final = 6


class CountedCycle(NamedTuple):
    """A cycle as it was just counted, handed to ``Detector(on_cycle=...)``: its series in
    ``Detector.cycles`` (``cycle`` is ``OVERFLOW`` once the metric holds MAX_SERIES label sets) and
    the span where the name returned, by its trace and span id as sent (opaque bytes, unchecked)."""

    kind: str
    cycle: str
    trace_id: bytes
    span_id: bytes


@dataclass(frozen=True)
class DetectorLimits:
    """The bounds on detection state (see the module docstring)."""

    max_traces: int = 50_000
    max_spans: int = 1_000_000
    max_spans_per_trace: int = 10_000
    trace_ttl: float = 120.0
    # How long a tool call's delegation edge waits for an agent run below it to take its place:
    # the run may come from another process, whose exporter sends it after the tool's.
    tool_edge_wait: float = 10.0


class _Trace:
    """Detection state of one trace: settled paths, spans waiting here, cycles seen."""

    __slots__ = ("callees", "calls", "cycles", "held", "last_seen", "paths", "tools", "trace_id", "waiting")

    def __init__(self, trace_id: bytes, last_seen: float = 0.0) -> None:
        self.trace_id = trace_id
        self.paths: dict[bytes, Path] = {}
        # span id of this trace -> the spans waiting for it: its children that came first, and
        # trace roots of other traces that link to it
        self.waiting: dict[bytes, list[Waiter]] = {}
        self.held = 0  # spans in ``waiting``
        # (kind, loop names from their least rotation): the loops counted in this trace
        self.cycles: set[tuple[str, tuple[str, ...]]] | None = None
        # id of a tool call's path -> the agents that ran below it (the path is held in ``paths``
        # for as long as the trace is, so its id stays its own)
        self.callees: dict[int, set[str]] | None = None
        # The tool calls whose edges wait to count (see Detector._count_tool_edges), as
        # [path, when, path, when, ...] (a tool's edge is its path's last two names; ``when`` is
        # the time of the request that settled it, one float object a request).
        self.tools: list[Any] | None = None
        # The calls counted in this trace (see Detector._count_call): their paths while they are
        # of one source, then names of a path -> the calls there, the guard's spans' in the low
        # bits and the other spans' above _OTHERS.
        self.calls: list[Path] | dict[Path, int] | None = None
        self.last_seen = last_seen


def _count(tally: dict[Any, int], key: Any, overflow: Any, by: int = 1) -> Any:
    """Add to a metric's tally, folding new label sets past MAX_SERIES into ``overflow``; the key
    counted."""
    count = tally.get(key)
    if count is None and len(tally) >= MAX_SERIES:
        key = overflow
        count = tally.get(key)
    tally[key] = (count or 0) + by
    return key


_NO_TRACE: Final = _Trace(b"")  # stands for "no trace yet" in ingest's loop; never holds a span


class Detector:
    """Incremental cycle detection over parsed OTLP requests; see the module docstring.

    Counters are plain dicts, read by the metrics collector at scrape time:
    ``cycles[(kind, label)]``, ``delegations[(caller, callee)]``,
    ``decisions[(decision, reason, name)]``, ``evictions[reason]``, ``dropped[reason]``,
    ``duplicates``, and of delegation trees ``tree_hops`` (trees per bucket of
    ``TREE_HOPS_BUCKETS``, the last past them), ``tree_hops_sum`` and ``tree_evictions[reason]``.
    Each cycle counted is also handed to ``on_cycle``, when given, as a :class:`CountedCycle`.
    """

    def __init__(
        self, limits: DetectorLimits | None = None, on_cycle: Callable[[CountedCycle], None] | None = None
    ) -> None:
        self.limits = limits or DetectorLimits()
        self.on_cycle = on_cycle
        if self.limits.max_traces < 2:
            raise ValueError("max_traces must be at least 2")
        self.cycles: dict[tuple[str, str], int] = {}
        self.delegations: dict[tuple[str, str], int] = {}
        self.decisions: dict[tuple[str, str, str], int] = {}
        self.evictions: dict[str, int] = {"ttl": 0, "capacity": 0}
        self.dropped: dict[str, int] = {"trace_full": 0}
        self.duplicates = 0
        self.truncated: dict[str, int] = {"name": 0, "label": 0}
        # Least recently active first. An OrderedDict, not a dict: taking the oldest entry off a
        # dict again and again leaves dead slots at its front that every next(iter()) rescans,
        # which made eviction cost grow with the number of traces held.
        self._traces: OrderedDict[bytes, _Trace] = OrderedDict()
        # Delegation trees: root (its bytes as sent) -> (largest hop count seen, when last seen),
        # least recently active first; observed into tree_hops when let go.
        self._trees: OrderedDict[bytes, tuple[int, float]] = OrderedDict()
        self.tree_hops: list[int] = [0] * (len(TREE_HOPS_BUCKETS) + 1)
        self.tree_hops_sum = 0
        self.tree_evictions: dict[str, int] = {"ttl": 0, "capacity": 0}
        # scope -> (names calls otherwise, since when, watched requests that showed nothing)
        self._scopes: dict[str, tuple[bool, float, int]] = {}
        self._scope_ids: dict[str, int] = {}  # scope -> its bits in markers
        # One int object per marker value: a path holds its marker, and markers are past the
        # small ints Python keeps one object of.
        self._markers: dict[int, int] = {}
        # The traces whose tool calls wait to count their edges (in ``_Trace.tools``), by the time
        # their oldest waiting call was settled. The edges count after ``tool_edge_wait`` (see
        # ``expire``), or when their trace is evicted, unless an agent run below took them over,
        # which it marks in its trace's ``callees``.
        self._tool_traces: OrderedDict[bytes, _Trace] = OrderedDict()
        self._now = 0.0  # the time of the request being read, or of the sweep under way
        self._decided_here = 0  # decisions read span by span in the request being ingested
        self._marker_hint = MARKERS[0]  # the dialect marker the last request that held one held
        self._stored = 0  # spans held, settled or waiting, over all traces
        self._pending = 0  # of which waiting

    @property
    def active_traces(self) -> int:
        return len(self._traces)

    @property
    def stored_spans(self) -> int:
        return self._stored

    @property
    def pending_spans(self) -> int:
        return self._pending

    @property
    def active_trees(self) -> int:
        return len(self._trees)

    # --- ingest -----------------------------------------------------------------------------

    def ingest(self, request: RequestView, raw: bytes, now: float) -> int:
        """Take one parsed request (``raw`` is its protobuf bytes); return how many spans it had.

        Every span whose ancestry is complete is settled now, with every span that waited for it.
        """
        steps = self.ingest_steps(request, raw, now)
        try:
            while True:
                next(steps)
        except StopIteration as done:
            received: int = done.value
            return received

    def ingest_steps(
        self, request: RequestView, raw: bytes, now: float, step: int = 0
    ) -> Generator[None, None, int]:
        """:meth:`ingest` in steps: a generator that pauses after every ``step`` spans (never when
        ``step`` is 0) and returns the number of spans.

        Between two steps the caller may do other work, but nothing else with this detector: one
        request is ingested at a time, to its end.
        """
        countdown = step
        # (find, not `in`: a bytes `in` tries its operand as an int first, at the cost of an error)
        guard_at = raw.find(_GUARD_BYTES)
        guard = guard_at >= 0
        # The marker the last request held first: a pipeline's traffic is mostly of one kind, and
        # each marker not there costs a search of the whole request.
        dialect_markers = raw.find(self._marker_hint) >= 0
        if not dialect_markers:
            for marker_bytes in MARKERS:
                if marker_bytes is not self._marker_hint and raw.find(marker_bytes) >= 0:
                    self._marker_hint = marker_bytes
                    dialect_markers = True
                    break
        per_trace = self.limits.max_spans_per_trace
        max_traces = self.limits.max_traces
        received = skipped = 0
        last_trace_id: bytes | None = None  # no trace id equals it: the first span looks its trace up
        trace = _NO_TRACE
        paths: dict[bytes, Path] = {}
        delegations = self.delegations
        waiting: dict[bytes, list[Waiter]] = {}
        full = False
        call_prefixes = CALL_PREFIXES  # locals: read once per span
        sides = _SIDES
        markers = self._markers
        tool_traces = self._tool_traces
        self._now = now
        traces = self._traces
        # Call spans settled without reading their attributes (the guard's, and others): their
        # decisions are counted after.
        undecided: list[tuple[SpanView, str]] = []
        undecided_others: list[tuple[SpanView, str]] = []
        self._decided_here = 0
        guard_scope = False  # whether the request holds spans of the guard's scope
        # Where those are, (resource, scope, spans) each, and whether spans of other scopes are there too.
        guard_groups: list[tuple[int, int, int]] = []
        other_scopes = False
        name: str | None  # a call span's name
        # The spans' own bytes, read in the scopes whose spans are searched (parsed once).
        encoded_spans: EncodedSpansView | None = None
        for resource_index, resource_spans in enumerate(request.resource_spans):
            for scope_index, scope_spans in enumerate(resource_spans.scope_spans):
                # A list first: indexing upb's container span by span (as reversed() does) costs
                # more than the rest of the loop.
                spans = list(scope_spans.spans)
                received += len(spans)
                backwards = len(spans) > 1 and spans[0].start_time_unix_nano > spans[-1].start_time_unix_nano
                if backwards:
                    # Exporters send spans as they end, children before parents: read such a
                    # batch backwards and parents come first, so little has to wait.
                    spans.reverse()
                scope = scope_spans.scope.name
                guarded = guard and scope == GUARD_SCOPE
                if guarded:
                    guard_scope = True
                    guard_groups.append((resource_index, scope_index, len(spans)))
                else:
                    other_scopes = True
                scope_bits = self._scope_bits(scope) | (_GUARDED if guarded else 0)
                agent_bits = scope_bits | _NAME_FORM_BITS | _AGENT_BITS  # of a span named in the
                tool_bits = scope_bits | _NAME_FORM_BITS | _TOOL_BITS  # GenAI form, but its side
                watch = dialect_markers and self._watch_scope(scope, now)
                attribute_calls = 0  # spans found to be calls by their attributes
                if watch:
                    # The spans' bytes, in the order of ``spans``: one is taken for each span read.
                    if encoded_spans is None:
                        encoded_spans = parse_encoded_spans(raw) or _NO_ENCODED_SPANS
                    encodings = _encodings(encoded_spans, resource_index, scope_index, len(spans))
                    if encodings is None:
                        encodings = [span.SerializeToString() for span in spans]
                    elif backwards:
                        encodings.reverse()
                    encoded_here = iter(encodings)
                if step:
                    # Pause between chunks of ``step`` spans (and after a run of small scopes that
                    # adds up to as many), checked per chunk: nothing is added to the span loop.
                    countdown -= len(spans)
                    if countdown <= 0:
                        countdown = step
                        yield
                    chunks: list[list[SpanView]] | tuple[list[SpanView]] = (
                        [spans[at : at + step] for at in range(0, len(spans), step)]
                        if len(spans) > step
                        else (spans,)
                    )
                else:
                    chunks = (spans,)
                for number, chunk in enumerate(chunks):
                    if number:
                        yield
                    for span in chunk:
                        trace_id = span.trace_id
                        if trace_id != last_trace_id:
                            found = traces.get(trace_id)
                            if found is None:
                                # _touch, inlined: a new trace (the common case under load).
                                if len(traces) >= max_traces:
                                    self._evict(next(iter(traces)), "capacity")
                                trace = traces[trace_id] = _Trace(trace_id, now)
                            else:
                                trace = found
                                traces.move_to_end(trace_id)
                                trace.last_seen = now
                            paths = trace.paths
                            waiting = trace.waiting
                            last_trace_id = trace_id
                            full = len(paths) + trace.held >= per_trace
                        span_id = span.span_id
                        if span_id in paths:
                            self.duplicates += 1
                            skipped += 1
                            if watch:
                                next(encoded_here)  # (each span's bytes go along with it)
                            continue
                        if full:
                            self.dropped["trace_full"] += 1
                            skipped += 1
                            if watch:
                                next(encoded_here)
                            continue
                        parent_id = span.parent_span_id
                        span_name = span.name
                        if span_name.startswith(call_prefixes):
                            name = span_name[
                                _WORKFLOW_PREFIX_LENGTH if span_name[7] == "w" else _PREFIX_LENGTH :
                            ]
                            if len(name) > MAX_NAME_CHARS:
                                name = self._cut(name)
                            tool = span_name[0] == "e"
                            marker = (tool_bits if tool else agent_bits) | sides.get(span.kind, 0)
                            encoded = next(encoded_here) if watch else b""
                        else:
                            if watch:
                                marker = 0  # not a call (unless its attributes say so)
                                encoded = next(encoded_here)
                                call = read_call(span_name, scope, encoded)
                                if call is not None:
                                    attribute_calls += 1
                                    kind_of, name, form, conditional = call
                                    if conditional and parent_id:
                                        parent = paths.get(parent_id)
                                        if (
                                            parent is not None
                                            and len(parent) > _HEAD
                                            and parent[1] & _KIND_BITS != _TOOL_BITS  # type: ignore[operator]
                                        ):
                                            # A call only first below a tool, and the nearest call
                                            # above is none: a link, settled as unnamed spans are.
                                            kind_of = 0
                                    if kind_of:
                                        if name and len(name) > MAX_NAME_CHARS:
                                            name = self._cut(name)
                                        tool = kind_of == TOOL
                                        marker = (
                                            scope_bits
                                            | kind_of << _KIND_SHIFT
                                            | form << _FORM_SHIFT
                                            | (_CONDITIONAL if conditional else 0)
                                            | sides.get(span.kind, 0)
                                        )
                            if not watch or not marker:
                                if parent_id:
                                    parent = paths.get(parent_id)
                                    if parent is None:
                                        self._wait(
                                            trace,
                                            parent_id,
                                            (trace_id, span_id, parent_id, None, 0, None, None),
                                        )
                                        continue
                                elif span.links:
                                    waiter = (trace_id, span_id, parent_id, None, 0, None, None)
                                    linked = self._linked_path(span, waiter, now)
                                    if linked is None:
                                        continue
                                    parent = linked
                                else:
                                    parent = ROOT_PATH
                                # The common case, kept inline: an unnamed span shares its parent's path.
                                paths[span_id] = parent
                                if waiting and span_id in waiting:
                                    self._release(trace, span_id, parent)
                                continue
                        parent = paths.get(parent_id) if parent_id else None
                        if parent is None or not name:
                            into = undecided if guarded else undecided_others
                            self._call(trace, span, span_id, parent_id, parent, marker, name, guarded,
                                       guard, now, into, encoded)  # fmt: skip
                            continue
                        # _call's common case, inlined: a named call under a settled parent.
                        if guarded:
                            undecided.append((span, name))
                        elif guard:
                            undecided_others.append((span, name))
                        last = len(parent) - 1
                        if (
                            _HEAD <= last < MAX_PATH_NAMES
                            and name not in parent
                            # (an agent below a tool is the tool's run: _named handles it)
                            and (tool or parent[1] & _KIND_BITS != _TOOL_BITS)  # type: ignore[operator]
                        ):
                            # _named's common case, inlined: a new name under a named ancestor.
                            path = (
                                parent[0],
                                markers.get(marker) or self._marker(marker),
                                *parent[_HEAD:],
                                name,
                            )
                            if tool:
                                waiting_tools = trace.tools
                                if waiting_tools is None:
                                    waiting_tools = trace.tools = []
                                    tool_traces[trace_id] = trace
                                waiting_tools.append(path)
                                waiting_tools.append(now)
                            else:
                                # _count_call's common case, inlined: every call of the trace so
                                # far is of this span's source.
                                calls = trace.calls
                                if calls is None or (
                                    type(calls) is list and not (calls[0][1] ^ marker) & _GUARDED  # type: ignore[operator]
                                ):
                                    if calls is None:
                                        trace.calls = [path]
                                    else:
                                        calls.append(path)
                                    edge: tuple[str, str] = (parent[last], name)  # type: ignore[assignment]
                                    count = delegations.get(edge)
                                    if count is None:
                                        _count(delegations, edge, _OVERFLOW_EDGE)
                                    else:
                                        delegations[edge] = count + 1
                                else:
                                    self._count_call(trace, path, marker)
                        else:
                            path = self._named(trace, name, marker, parent, span_id, span)
                        paths[span_id] = path
                        if waiting and span_id in waiting:
                            self._release(trace, span_id, path)
                        continue
                if watch:
                    self._learn_scope(scope, attribute_calls > 0, now)
        hops = False
        guard_bytes = raw
        if undecided or undecided_others or guard_scope:
            joined = None
            if guard_scope and other_scopes:
                # The guard's spans share the request with others' (whose spans hold prompts, and
                # which a Collector's batches put between the guard's): its keys are searched in
                # the guard's spans' own bytes alone, not across the request.
                if encoded_spans is None:
                    encoded_spans = parse_encoded_spans(raw) or _NO_ENCODED_SPANS
                joined = _joined_encodings(encoded_spans, guard_groups)
            if joined is not None:
                guard_bytes, start, end = joined, 0, len(joined)
            else:
                # Every otel_guard.* key stands between the first and the last "otel_guard." of
                # the request: the keys are searched there.
                start = max(0, guard_at - _GUARD_MARGIN)
                end = raw.rfind(_GUARD_BYTES) + _GUARD_MARGIN
            if undecided or undecided_others:
                self._count_decisions(undecided, undecided_others, guard_bytes, start, end)
            hops = guard_scope and guard_bytes.find(_HOPS_FIELD, start, end) >= 0
        self._stored += received - skipped
        self._enforce_span_budget()
        if hops:
            yield from self._read_trees(guard_bytes, now, step)
        return received

    def _count_decisions(
        self,
        guards: list[tuple[SpanView, str]],
        others: list[tuple[SpanView, str]],
        raw: bytes,
        start: int,
        end: int,
    ) -> None:
        """Count the decisions of call spans settled without reading their attributes.

        When every decision in the request (all within ``raw[start:end]``) is ``allow`` and there
        are exactly as many as the guard's spans here plus those already read, each guard span
        holds one: no span is read.
        """
        decisions = self.decisions
        # The key alone counts a decision in either field order; `allow` is looked for in both
        # (the OpenTelemetry Collector writes a KeyValue's value before its key).
        total = raw.count(_DECISION_FIELD, start, end)
        allowed = raw.count(_ALLOW, start, end)
        if allowed != total:
            allowed += raw.count(_ALLOW_VALUE_FIRST, start, end)
        if total == allowed == len(guards) + self._decided_here:
            for name, count in Counter([name for _, name in guards]).items():
                key = ("allow", "", name)
                _count(decisions, key, _OVERFLOW_DECISION, count)
            return
        for span, name in (*guards, *others):
            decision = self._decision(Attributes(span), name)
            if decision is not None:
                _count(decisions, decision, _OVERFLOW_DECISION)

    # --- delegation trees -------------------------------------------------------------------

    def _read_trees(self, raw: bytes, now: float, step: int) -> Generator[None, None, None]:
        """Note the request's hop counts by tree, read from its bytes; pauses after every ``step``
        counts (never when 0).

        Split at the counts' keys, the bytes between two keys hold a span's root and, written value
        first, its count's value; the bytes after a key, written key first, the value. The guard
        writes the root just before the count: those are read by their places, others searched.
        """
        pieces = raw.split(_HOPS_FIELD)
        largest: dict[bytes, int] = {}
        last = len(pieces) - 1
        for chunk in range(0, last, step or last):
            if chunk:
                yield
            for at in range(chunk, min(chunk + (step or last), last)):
                before = pieces[at]
                after = pieces[at + 1]
                if (
                    after[:3] == _ONE_BYTE_COUNT
                    and len(after) > 3
                    and after[3] < 0x80
                    and before[-61:-34] == _ROOT_KEY_FIRST
                ):
                    root = before[-34:-2]  # key first: ...root, its value | next KeyValue's tag, length
                    hops = after[3]
                elif (
                    before[-4:-1] == _ONE_BYTE_COUNT
                    and before[-1] < 0x80
                    and before[-29:-6] == _ROOT_FIELD
                    and before[-65:-61] == _ROOT_VALUE_HEAD
                ):
                    root = before[-61:-29]  # value first: ...root's value, key | tag, length | value
                    hops = before[-1]
                else:
                    found = _tree_count(before, after)
                    if found is None:
                        continue
                    root, hops = found
                if hops > largest.get(root, 0):
                    largest[root] = hops
        trees = self._trees
        for root, hops in largest.items():
            held = trees.get(root)
            if held is None:
                if len(trees) >= self.limits.max_traces:
                    self._release_tree(next(iter(trees)), "capacity")
                trees[root] = (hops, now)
            else:
                trees.move_to_end(root)
                trees[root] = (hops if hops > held[0] else held[0], now)

    def _release_tree(self, root: bytes, reason: str | None) -> None:
        """Let go of a tree: observe its largest hop count (counted in tree_evictions by reason)."""
        hops = self._trees.pop(root)[0]
        self.tree_hops[bisect_left(TREE_HOPS_BUCKETS, hops)] += 1
        self.tree_hops_sum += hops
        if reason is not None:
            self.tree_evictions[reason] = self.tree_evictions.get(reason, 0) + 1

    def release_trees(self) -> int:
        """Let go of every tree held (the processor stops): each observed once; return how many."""
        released = len(self._trees)
        while self._trees:
            self._release_tree(next(iter(self._trees)), None)
        return released

    def _watch_scope(self, scope: str, now: float) -> bool:
        """Whether to look for calls named otherwise among this scope's spans in this request.

        Reading attributes on every span would cost as much as the rest of detection, and
        GenAI-convention instrumentations name every call ``invoke_agent …``/``execute_tool …``.
        So a scope is watched until its requests show how it names calls (see ``_learn_scope``),
        and checked again after SCOPE_RECHECK_SECONDS.
        """
        habit = self._scopes.get(scope)
        if habit is None or now - habit[1] > SCOPE_RECHECK_SECONDS:
            return True
        return habit[0]

    def _learn_scope(self, scope: str, otherwise: bool, now: float) -> None:
        """Remember what a watched request showed of the scope's way of naming calls.

        A call named otherwise keeps the scope watched (until SCOPE_RECHECK_SECONDS pass without
        another). A scope never seen to name a call otherwise stops being watched after
        SCOPE_LEARN_REQUESTS watched requests: one request says little on its own, as spans
        arrive as they end (Traceloop's ``invoke_agent X`` may come before its ``X.workflow``,
        and a SimpleSpanProcessor sends one span per request).
        """
        habit = self._scopes.get(scope)
        if habit is not None and now - habit[1] > SCOPE_RECHECK_SECONDS:
            habit = None
        if otherwise:
            learned = (True, now, -1)  # -1: seen to name calls otherwise
        elif habit is not None and habit[2] < 0:
            return
        else:
            seen = (habit[2] if habit is not None else 0) + 1
            learned = (seen < SCOPE_LEARN_REQUESTS, habit[1] if habit is not None else now, seen)
        if habit is None and len(self._scopes) >= _MAX_SCOPES:
            self._scopes.clear()  # bounded: scope names come from the senders
        self._scopes[scope] = learned

    def _scope_bits(self, scope: str) -> int:
        """The scope's bits in a marker: its own small number (0 for any past the first 65,535)."""
        number = self._scope_ids.get(scope)
        if number is None:
            number = len(self._scope_ids) + 1 if len(self._scope_ids) < _MAX_SCOPE_IDS else 0
            if number:
                self._scope_ids[scope] = number
        return number << _SCOPE_SHIFT

    def _call(
        self,
        trace: _Trace,
        span: SpanView,
        span_id: bytes,
        parent_id: bytes,
        parent: Path | None,
        marker: int,
        name: str | None,
        guarded: bool,
        guard: bool,
        now: float,
        undecided: list[tuple[SpanView, str]],
        encoded: bytes,
    ) -> None:
        """Settle or park a call span, reading its attributes only where they are needed.

        ``span_id``, ``parent_id`` are the span's, ``parent`` its parent's path when it is settled;
        ``marker`` holds what the span is (scope, kind, form, side); ``name`` is its call name (cut
        to MAX_NAME_CHARS), or None or empty when the span's name does not give it; ``encoded``
        the span's bytes, when they have been read (else empty).
        """
        name = name or None
        decision = None
        chain: Path | None = None
        attributes: Attributes | None = None
        if name is None or (guard and parent is None):
            # The slow way, for spans that need it: a name from the attributes, a span that must
            # wait (its facts are kept, the span is not), a trace root that may continue a chain.
            attributes = Attributes.of(encoded) if encoded else Attributes(span)
            if name is None and marker & _FORM_BITS == _NAME_FORM_BITS:
                # A GenAI span name with no subject ("invoke_agent "): the attributes may name it.
                name = self._cut(name_of_named_call(span.name, attributes))
            if name is None:
                # A call with no name to go by is an unnamed link, like any other span.
                self._unnamed_call(trace, span, span_id, parent_id, parent, now)
                return
            if guard:
                if parent_id and parent is None:
                    # It waits, and the span will be gone when it settles: keep what it says (a
                    # span of another scope with no otel_guard.* bytes has none of it).
                    read = guarded or attributes.holds(_GUARD_BYTES)
                    if read:
                        decision = self._decision(attributes, name)
                        if decision is not None:
                            self._decided_here += 1
                        marker |= max(attributes.integer(_NAME_DEPTH) or 0, 0) << _NAME_DEPTH_SHIFT
                else:
                    read = guarded or attributes.holds(_GUARD_BYTES)  # (a trace root)
                    undecided.append((span, name))
                # A trace root continues its chain; a span that waits keeps it, in case its parent
                # never comes (e.g. a tier that receives the guard's spans only).
                if parent is None and read and (attributes.integer(_DEPTH) or 0) > 1:
                    agents = attributes.strings(_AGENTS)
                    chain = _chain_path([self._cut(a) for a in agents] if agents else None, name)
        elif guard:
            undecided.append((span, name))
        waiter = (trace.trace_id, span_id, parent_id, name, marker, decision, chain)
        if parent_id:
            if parent is None:
                self._wait(trace, parent_id, waiter)
                return
        elif chain is not None:
            parent = chain
        elif span.links:
            parent = self._linked_path(span, waiter, now)
            if parent is None:
                return
        else:
            # A trace root that names the agent that called it continues that caller's path, as
            # a call from another trace.
            if attributes is None:
                attributes = Attributes.of(encoded) if encoded else Attributes(span)
            caller = self._cut(attributes.string(_CALLER))
            if not caller:
                # A root that starts a path (_named of ROOT_PATH, inlined): its name alone.
                path: Path = (0, self._markers.get(marker) or self._marker(marker), name)
                trace.paths[span_id] = path
                if trace.waiting and span_id in trace.waiting:
                    self._release(trace, span_id, path)
                return
            parent = (1, _CALLER_ENTRY | _AGENT_BITS, caller)
        # _settle, inlined: this runs for every call span.
        path = self._named(trace, name, marker, parent, span_id, span)
        if decision is not None:
            _count(self.decisions, decision, _OVERFLOW_DECISION)
        trace.paths[span_id] = path
        if trace.waiting and span_id in trace.waiting:
            self._release(trace, span_id, path)

    def _unnamed_call(
        self, trace: _Trace, span: SpanView, span_id: bytes, parent_id: bytes, parent: Path | None, now: float
    ) -> None:
        waiter = (trace.trace_id, span_id, parent_id, None, 0, None, None)
        if parent_id:
            if parent is None:
                self._wait(trace, parent_id, waiter)
                return
        elif span.links:
            parent = self._linked_path(span, waiter, now)
            if parent is None:
                return
        else:
            parent = ROOT_PATH
        self._settle(trace, waiter, parent)

    def _touch(self, trace_id: bytes, now: float) -> _Trace:
        traces = self._traces
        trace = traces.get(trace_id)
        if trace is None:
            if len(traces) >= self.limits.max_traces:
                # The least recently active trace goes; never the one being read, which is the
                # most recent (hence max_traces >= 2).
                self._evict(next(iter(traces)), "capacity")
            trace = traces[trace_id] = _Trace(trace_id, now)
        else:
            traces.move_to_end(trace_id)
            trace.last_seen = now
        return trace

    def _wait(self, holder: _Trace, span_id: bytes, waiter: Waiter) -> None:
        holder.waiting.setdefault(span_id, []).append(waiter)
        holder.held += 1
        self._pending += 1

    def _linked_path(self, span: SpanView, waiter: Waiter, now: float) -> Path | None:
        """The path a trace root continues through its first link; None when it has to wait."""
        link = span.links[0]
        holder = self._traces.get(link.trace_id)
        if holder is None:
            holder = self._touch(link.trace_id, now)
            # The root's own trace must stay the most recent one, or a later capacity eviction
            # could take it while this request is still on it.
            self._traces.move_to_end(waiter[_TRACE_ID])
        else:
            found = holder.paths.get(link.span_id)
            if found is not None:
                return _crossed(found)
        self._wait(holder, link.span_id, waiter)
        return None

    def _settle(self, owner: _Trace, waiter: Waiter, parent: Path, span: SpanView | None = None) -> None:
        """Give a span its path, count what it shows, then settle whatever waited for it."""
        name = waiter[_NAME]
        path = (
            parent
            if name is None
            else self._named(owner, name, waiter[_MARKER], parent, waiter[_SPAN_ID], span)
        )
        decision = waiter[_DECISION]
        if decision is not None:
            _count(self.decisions, decision, _OVERFLOW_DECISION)
        span_id = waiter[_SPAN_ID]
        owner.paths[span_id] = path
        if owner.waiting and span_id in owner.waiting:
            self._release(owner, span_id, path)

    def _named(
        self,
        trace: _Trace,
        name: str,
        marker: int,
        parent: Path,
        span_id: bytes,
        span: SpanView | None = None,
    ) -> Path:
        """The path of a named span (``span_id``) under ``parent``; counts its cycle and its
        delegation edge."""
        last = len(parent) - 1
        # The nearest call's kind (the heads are ints: read as such, not converted).
        below: int = parent[1] & _KIND_BITS if last >= _HEAD else 0  # type: ignore[operator]
        if marker & _CONDITIONAL and below not in (0, _TOOL_BITS):
            return parent  # a call only first below a tool, or at the top: here, a link
        if below == _TOOL_BITS and marker & _KIND_BITS == _AGENT_BITS:
            return self._agent_of_tool(trace, name, marker, parent, span_id)
        if last >= _HEAD and name not in parent:
            # The common case first: a name not yet on the path, under a named ancestor.
            path = self._extended(parent, marker, name)
            self._edge(trace, path, marker)
            return path
        if name in parent:
            index = last
            while parent[index] != name:
                index -= 1
            if index == last:
                if marker & _GUARDED and not marker >> _NAME_DEPTH_SHIFT and span is not None:
                    name_depth = Attributes(span).integer(_NAME_DEPTH) or 0
                    marker |= max(name_depth, 0) << _NAME_DEPTH_SHIFT
                repeats = parent[_HEAD:].count(name) if marker & _GUARDED else 1
                if _same_call(int(parent[1]), marker, repeats):
                    path = (parent[0], self._marker(marker), *parent[_HEAD:])
                    if marker & _KIND_BITS == _TOOL_BITS and int(parent[1]) & _KIND_BITS == _TOOL_BITS:
                        self._retarget_tool(trace, parent, path)
                    return path
            self._cycle(trace, parent, index, name, span_id)
        path = self._extended(parent, marker, name)
        if last >= _HEAD:
            self._edge(trace, path, marker)
        return path

    def _agent_of_tool(self, trace: _Trace, name: str, marker: int, tool: Path, span_id: bytes) -> Path:
        """The path of an agent run below a tool call: the run of that tool, in the agent's name.

        The tool's name gives way to the agent's; the tool's edge (caller -> tool), waiting to
        be counted, gives way to the edge caller -> agent. Two agent spans of one tool call
        (Traceloop records a LangGraph agent twice) count one edge.
        """
        names = tool[_HEAD:-1]
        base: Path = (min(tool[0], len(names)), 0, *names)
        if name in names:
            index = len(base) - 1
            while base[index] != name:
                index -= 1
            self._cycle(trace, base, index, name, span_id)
        callees = trace.callees
        if callees is None:
            callees = trace.callees = {}
        key = id(tool)
        ran = callees.get(key)
        if ran is None:
            ran = callees[key] = set()
        path = self._extended(base, marker, name)
        if name not in ran:
            if not ran:
                # The tool call stands recorded at its own path as well, counting no edge: the
                # other instrumentation's span of it, with no agent run below, must not add one.
                self._count_call(trace, tool, tool[1], edge=False)  # type: ignore[arg-type]
            ran.add(name)
            if names:
                self._count_call(trace, path, marker)
        return path

    def _cycle(self, trace: _Trace, parent: Path, index: int, name: str, span_id: bytes) -> None:
        """Count the cycle of ``name`` returning to ``parent[index]`` (in the span ``span_id``), once
        per loop and trace."""
        last = len(parent) - 1
        if index - _HEAD < int(parent[0]):
            kind = "cross_trace"
        elif index == last:
            kind = "direct"
        else:
            kind = "cross_function"
        loop = tuple(str(n) for n in parent[index:])
        # A loop's later turns are rotations of its first: planner>budget>planner, then
        # budget>planner>budget. The least rotation stands for all of them.
        key = (kind, min(loop[i:] + loop[:i] for i in range(len(loop))))
        seen = trace.cycles
        if seen is None:
            seen = trace.cycles = set()
        if key not in seen:
            seen.add(key)
            label = ">".join([*loop, name])
            if len(label) > MAX_LABEL_CHARS:
                label = label[: MAX_LABEL_CHARS - len(CUT)] + CUT
                self.truncated["label"] += 1
            kind, label = _count(self.cycles, (kind, label), (kind, OVERFLOW))
            if self.on_cycle is not None:
                self.on_cycle(CountedCycle(kind, label, trace.trace_id, span_id))

    def _edge(self, trace: _Trace, path: Path, marker: int) -> None:
        """Count a call's delegation edge (:func:`_edge_of` its path); a tool's waits for an agent
        run below it (``expire``)."""
        if marker & _KIND_BITS == _TOOL_BITS:
            tools = trace.tools
            if tools is None:
                tools = trace.tools = []
                self._tool_traces[trace.trace_id] = trace
            tools += (path, self._now)
        else:
            self._count_call(trace, path, marker)

    def _count_call(self, trace: _Trace, path: Path, marker: int, edge: bool = True) -> None:
        """Count a call's delegation edge, once however many instrumentations recorded the call.

        Beside the inline guard another instrumentation records the same calls, and where it
        parents its spans by its runtime's own run tree, its spans of a call stand beside the
        guard's rather than above or below them. So the calls at one path (its names) are
        counted per source, the guard's spans and the others, and the trace counts the larger
        of the two: the guard's chain is the ground truth for its hops, and a call that only
        the other instrumentation saw still counts. ``edge`` False records a call that counts
        no edge of its own (a tool call whose agent run counted it).

        While a trace has calls of one source only (nearly always), they are kept as a list of
        their paths; the counts per path are made from it when the other source shows up.
        """
        calls = trace.calls
        if calls is None:
            trace.calls = [path]
        elif type(calls) is list:
            if (calls[0][1] ^ marker) & _GUARDED:  # type: ignore[operator]
                calls = trace.calls = _calls_by_path(calls)
                self._count_mixed(calls, path, marker, edge)
                return
            calls.append(path)
        else:
            self._count_mixed(calls, path, marker, edge)  # type: ignore[arg-type]
            return
        if edge:
            # _count_edge, inlined: this runs for every call.
            delegations = self.delegations
            pair: tuple[str, str] = (path[-2], path[-1])  # type: ignore[assignment]
            count = delegations.get(pair)
            if count is None:
                _count(delegations, pair, _OVERFLOW_EDGE)
            else:
                delegations[pair] = count + 1

    def _count_mixed(self, calls: dict[Path, int], path: Path, marker: int, edge: bool) -> None:
        key = path[_HEAD:]
        counted = calls.get(key, 0)
        guards, others = counted & _GUARDS, counted >> _OTHERS
        if marker & _GUARDED:
            guards += 1
            new = guards > others
        else:
            others += 1
            new = others > guards
        calls[key] = guards | others << _OTHERS
        if new and edge:
            self._count_edge(path)

    def _count_edge(self, path: Path) -> None:
        delegations = self.delegations
        pair = _edge_of(path)
        count = delegations.get(pair)
        if count is None:
            _count(delegations, pair, _OVERFLOW_EDGE)
        else:
            delegations[pair] = count + 1

    @staticmethod
    def _retarget_tool(trace: _Trace, tool: Path, again: Path) -> None:
        """A second span of one tool call (another instrumentation's) takes over its waiting edge,
        so that an agent run below either span takes the edge over; the agents run below either
        span are one call's (a run recorded under each counts once)."""
        callees = trace.callees
        if callees is None:
            callees = trace.callees = {}
        callees[id(again)] = callees.setdefault(id(tool), set())
        tools = trace.tools
        if tools:
            for at in range(0, len(tools), 2):
                if tools[at] is tool:
                    tools[at] = again
                    return

    def _count_tool_edges(self, now: float) -> None:
        """Count the edges of the tool calls that no agent run took over within ``tool_edge_wait``."""
        waiting = self._tool_traces
        deadline = now - self.limits.tool_edge_wait
        while waiting:
            trace_id = next(iter(waiting))
            trace = waiting[trace_id]
            if trace.tools and trace.tools[1] > deadline:
                break
            del waiting[trace_id]
            young = self._count_tools(trace, deadline)
            trace.tools = young or None
            if young:  # settled later than the oldest: they wait on
                waiting[trace_id] = trace

    def _count_tools(self, trace: _Trace, deadline: float | None = None) -> list[Any]:
        """Count the waiting tool edges of ``trace`` settled by ``deadline`` (all when None) that
        no agent run took over; return the others, still waiting."""
        callees = trace.callees
        tools = trace.tools or []
        young: list[Any] = []
        count_call = self._count_call
        if deadline is None:  # all of them (the trace is evicted)
            delegations = self.delegations
            for path in tools[::2]:
                if callees and callees.get(id(path)):
                    continue
                marker: int = path[1]
                calls = trace.calls
                if type(calls) is list and not (calls[0][1] ^ marker) & _GUARDED:  # type: ignore[operator]
                    # _count_call's common case, inlined: the calls so far are of this one's source.
                    calls.append(path)
                    pair: tuple[str, str] = (path[-2], path[-1])
                    count = delegations.get(pair)
                    if count is None:
                        _count(delegations, pair, _OVERFLOW_EDGE)
                    else:
                        delegations[pair] = count + 1
                else:
                    count_call(trace, path, marker)
            return young
        for at in range(0, len(tools), 2):
            path = tools[at]
            if tools[at + 1] > deadline:
                young += (path, tools[at + 1])
            elif not callees or not callees.get(id(path)):
                count_call(trace, path, int(path[1]))
        return young

    @overload
    def _cut(self, name: str) -> str: ...
    @overload
    def _cut(self, name: str | None) -> str | None: ...
    def _cut(self, name: str | None) -> str | None:
        """``name`` within MAX_NAME_CHARS (counted when cut); None stays None."""
        if name is None or len(name) <= MAX_NAME_CHARS:
            return name
        self.truncated["name"] += 1
        return name[: MAX_NAME_CHARS - len(CUT)] + CUT

    def _decision(self, attributes: Attributes, name: str) -> tuple[str, str, str] | None:
        verdict = self._cut(attributes.string(_DECISION_KEY))
        if verdict is None:
            return None
        reason = self._cut(attributes.string(_REASON)) if verdict != "allow" else None
        return (verdict, reason or "", name)

    def _marker(self, marker: int) -> int:
        """The one int object of this marker value (any marker, past _MAX_MARKERS of them)."""
        if len(self._markers) < _MAX_MARKERS:
            return self._markers.setdefault(marker, marker)
        return marker

    def _extended(self, parent: Path, marker: int, name: str) -> Path:
        """``parent`` with one more name, keeping the last MAX_PATH_NAMES names."""
        marker = self._markers.get(marker) or self._marker(marker)
        if len(parent) - _HEAD < MAX_PATH_NAMES:
            return (parent[0], marker, *parent[_HEAD:], name)
        return (max(0, int(parent[0]) - 1), marker, *parent[_HEAD + 1 :], name)

    def _release(self, holder: _Trace, span_id: bytes, path: Path) -> None:
        """Settle the spans that waited for ``span_id``, and those that waited for them."""
        stack = [(holder, span_id, path)]
        while stack:
            holder, parent_id, parent_path = stack.pop()
            group = holder.waiting.pop(parent_id, None)
            if not group:
                continue
            for waiter in group:
                owner = self._take(holder, waiter)
                if owner is None:
                    continue
                # A waiter with no parent is a trace root that waited for the span it links to.
                base = parent_path if waiter[_PARENT_ID] else _crossed(parent_path)
                name = waiter[_NAME]
                new_path = (
                    base
                    if name is None
                    else self._named(owner, name, waiter[_MARKER], base, waiter[_SPAN_ID])
                )
                decision = waiter[_DECISION]
                if decision is not None:
                    _count(self.decisions, decision, _OVERFLOW_DECISION)
                span_id = waiter[_SPAN_ID]
                owner.paths[span_id] = new_path
                if owner.waiting and span_id in owner.waiting:
                    stack.append((owner, span_id, new_path))

    def _take(self, holder: _Trace, waiter: Waiter) -> _Trace | None:
        """Take a span out of waiting: the trace to settle it in, or None when it is not to be."""
        holder.held -= 1
        self._pending -= 1
        trace_id = waiter[_TRACE_ID]
        owner = holder if trace_id == holder.trace_id else self._traces.get(trace_id)
        if owner is None:  # its own trace was evicted meanwhile
            self._stored -= 1
            return None
        if waiter[_SPAN_ID] in owner.paths:
            self.duplicates += 1
            self._stored -= 1
            return None
        return owner

    # --- bounds -----------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Evict every trace idle for longer than the TTL, and count the tool edges whose wait is
        over; return how many traces went."""
        self._now = now
        deadline = now - self.limits.trace_ttl
        expired = 0
        traces = self._traces
        while traces:
            trace_id = next(iter(traces))
            if traces[trace_id].last_seen > deadline:
                break
            self._evict(trace_id, "ttl")
            expired += 1
        trees = self._trees
        while trees:
            root = next(iter(trees))
            if trees[root][1] > deadline:
                break
            self._release_tree(root, "ttl")
        self._count_tool_edges(now)
        return expired

    def _enforce_span_budget(self) -> None:
        traces = self._traces
        while self._stored > self.limits.max_spans and len(traces) > 1:
            self._evict(next(iter(traces)), "capacity")

    def _evict(self, trace_id: bytes, reason: str) -> None:
        """Drop a trace, after settling as roots the spans that waited here in vain."""
        trace = self._traces.pop(trace_id)
        if trace.waiting:
            self._settle_orphans(trace)
        self._stored -= len(trace.paths)
        # No agent run can take over its tool calls now: their edges count.
        if trace.tools:
            self._count_tools(trace)
            trace.tools = None
            self._tool_traces.pop(trace_id, None)
        self.evictions[reason] = self.evictions.get(reason, 0) + 1

    def _settle_orphans(self, trace: _Trace) -> None:
        """Settle what waited in an evicted trace in vain: linear in what waited.

        First the groups whose parent is neither settled nor waiting (each settles with whatever
        waited below it); what is left waits in loops of parent ids, broken anywhere.
        """
        waiting = trace.waiting
        if not waiting:
            return
        waiting_here = {
            waiter[_SPAN_ID]
            for group in waiting.values()
            for waiter in group
            if waiter[_TRACE_ID] == trace.trace_id
        }
        for parent_id in [p for p in waiting if p not in waiting_here]:
            self._settle_group(trace, waiting.pop(parent_id, None))
        while waiting:
            self._settle_group(trace, waiting.popitem()[1])  # from the end: no rescan of the front

    def _settle_group(self, trace: _Trace, group: list[Waiter] | None) -> None:
        for waiter in group or ():
            owner = self._take(trace, waiter)
            if owner is not None:
                self._settle(owner, waiter, waiter[_CHAIN] or ROOT_PATH)


class _NoEncodedSpans:
    """Stands for a request whose spans' bytes could not be read apart (they are then encoded)."""

    resource_spans: tuple[()] = ()


_NO_ENCODED_SPANS: Final[EncodedSpansView] = _NoEncodedSpans()


def _encodings(encoded_spans: EncodedSpansView, resource: int, scope: int, count: int) -> list[bytes] | None:
    """The bytes of each span of one scope of a request, or None when they do not match its spans."""
    try:
        encodings = list(encoded_spans.resource_spans[resource].scope_spans[scope].spans)
    except IndexError:
        return None
    return encodings if len(encodings) == count else None


def _joined_encodings(encoded_spans: EncodedSpansView, groups: list[tuple[int, int, int]]) -> bytes | None:
    """The bytes of the spans of these (resource, scope, spans) groups of a request, one after
    another, or None when they cannot be read apart."""
    pieces: list[bytes] = []
    for resource, scope, count in groups:
        encodings = _encodings(encoded_spans, resource, scope, count)
        if encodings is None:
            return None
        pieces += encodings
    return b"".join(pieces)


def _tree_count(before: bytes, after: bytes) -> tuple[bytes, int] | None:
    """(root, count) of the span whose ``otel_guard.budget.hops`` key stands between ``before`` and
    ``after`` (the bytes since the previous count's key, and up to the next), in any layout."""
    hops = _hops_of(before, after)
    if hops is None or hops <= 0:
        return None
    root_at = before.rfind(_ROOT_FIELD)
    if root_at < 0:
        return None
    root = _root_at(before, root_at, root_at + len(_ROOT_FIELD))
    return (root, hops) if root else None


def _hops_of(before: bytes, after: bytes) -> int | None:
    """The int value of the ``otel_guard.budget.hops`` KeyValue whose key stands between ``before``
    and ``after``: written key first, the value follows; value first, it ends where the key starts."""
    try:
        if after[:1] == b"\x12" and after[2] == _INT_TAG:
            # Key first: value tag, length, int tag, varint -- the varint must fill the value.
            number, stop = _varint(after, 3)
            if stop == 2 + after[1]:
                return number - (1 << 64) if number >= 1 << 63 else number
        # Value first: value tag, length, int tag, varint, then the key. The varint's last byte is
        # the only one below 0x80; the bytes before it run back to the int tag.
        at = len(before)
        if at < 4 or before[at - 1] >= 0x80:
            return None
        start = at - 1
        while start > max(at - 10, 3) and before[start - 1] >= 0x80:
            start -= 1
        if (
            before[start - 1] == _INT_TAG
            and before[start - 2] == at - start + 1
            and before[start - 3] == _VALUE_TAG
        ):
            number = _varint(before, start)[0]
            return number - (1 << 64) if number >= 1 << 63 else number
    except IndexError:
        pass
    return None


def _root_at(raw: bytes, at: int, end: int) -> bytes | None:
    """The string bytes of the ``otel_guard.chain.root`` KeyValue whose key field is ``raw[at:end]``,
    written key first or value first; None when it is no string of at most 125 bytes."""
    try:
        if raw[end] == _VALUE_TAG:
            # Key first: value tag, length, string tag, length, the string.
            length = raw[end + 3]
            if raw[end + 2] == _STRING_TAG and length < 0x80 and raw[end + 1] == length + 2:
                return raw[end + 4 : end + 4 + length]
        # Value first: the same, ending where the key starts; the guard's length is tried first.
        for length in (_GUARD_ROOT_CHARS, *range(0x7E)):
            start = at - length
            if start < 4:
                continue
            if (
                raw[start - 1] == length
                and raw[start - 2] == _STRING_TAG
                and raw[start - 3] == length + 2
                and raw[start - 4] == _VALUE_TAG
            ):
                return raw[start:at]
    except IndexError:
        pass
    return None


def _chain_path(agents: list[str] | None, name: str) -> Path | None:
    """The path of the earlier hops of a chain that a trace-root span continues."""
    if not agents:
        return None
    prior = agents[:-1] if agents[-1] == name else agents
    if not prior:
        return None
    prior = prior[-MAX_PATH_NAMES:]
    return (len(prior), _GUARDED | _AGENT_BITS, *prior)  # the chain's last hop: an agent's call


def _calls_by_path(paths: list[Path]) -> dict[Path, int]:
    """The calls of a trace's one source so far, counted per path (see Detector._count_call)."""
    calls: dict[Path, int] = {}
    for path in paths:
        key = path[_HEAD:]
        calls[key] = calls.get(key, 0) + (1 if int(path[1]) & _GUARDED else 1 << _OTHERS)
    return calls


def _edge_of(path: Path) -> tuple[str, str]:
    """The delegation edge of a named span: its path's last two names (caller, callee)."""
    return (str(path[-2]), str(path[-1]))


def _crossed(path: Path) -> Path:
    """The same path after it crossed into another trace: every name so far lies before it."""
    return (len(path) - _HEAD, *path[1:])


def _same_call(ancestor: int, marker: int, repeats: int) -> bool:
    """Whether a named span directly under a span of the same name is that same call again.

    ``repeats``: how often the name stands on the path above it (read for the guard's spans).
    """
    if ancestor & _CALLER_ENTRY:
        return False  # the caller a remote agent named: another call by definition
    if marker & _GUARDED:
        if marker & _KIND_BITS == ancestor & _KIND_BITS == _TOOL_BITS and not ancestor & _GUARDED:
            # The guard's span of a tool call, under another instrumentation's span of the call
            # (which made its span first). The chain's count of a tool's name says nothing here:
            # a path keeps a tool's name only until an agent runs below it.
            return True
        # The guard's span: a new hop when its chain holds the name more often than the path
        # above it (under the guard's own span of the call: once; under another instrumentation's
        # span of the call the guard refused or allowed: as often as the chain).
        return marker >> _NAME_DEPTH_SHIFT <= repeats
    if ancestor & _GUARDED:
        # Another instrumentation's span of the call the guard's span just recorded.
        return True
    if ancestor & _CLIENT or marker & _SERVER:
        return True  # the two sides of a remote call
    if ancestor & _KIND_BITS == _AGENT_BITS and marker & _KIND_BITS == _TOOL_BITS:
        return False  # an agent that calls a tool named after itself
    if (ancestor ^ marker) >> _SCOPE_SHIFT & _SCOPE_MASK:
        return True  # two instrumentations recording one call
    # One instrumentation: the same form is a new call (an agent that re-entered itself), another
    # form a wrapper of the same call.
    return bool((ancestor ^ marker) & _FORM_BITS)
