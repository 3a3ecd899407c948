"""The whole detection, plainly: OTLP requests in, the processor's counts out.

Spans are read through the OTLP protobuf classes (:func:`read`), each span's call through a
dialect table (:data:`reference.dialects.TABLE` unless another is given), each span's *path* --
its named ancestors, oldest first, each an :class:`Entry` -- from its parent's
(:meth:`Detection.path`), and the counts from the paths at the end (:meth:`Detection.metrics`).
Arrival order, batches and duplicates change nothing but which copy of a span is read (the first).
Where the detection picks one span of several (the span where a loop's name first returned), it
takes the first by start time, then span id.

One call is one hop: a named span directly below an entry of the same name is that call again when
:func:`same_call` says so, and a span read as an agent run directly below a tool call is that
tool's run (the tool's entry gives way to the agent's). Every other named span is a new call, and
a cycle when its name is already on the path where it still *waits*: an entry waits unless the
entry after it (for the last, the new call) is a transfer (a handoff its spans mark as one:
:attr:`Span.transfer`), for an agent that handed off waits for no answer.

A cycle's label joins its names by ``>``, each name escaped (:func:`label`: a backslash before each
backslash and each ``>`` in a name), so that it reads back into its names (:func:`label_names`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from reference import dialects
from reference.dialects import AGENT, TABLE, TOOL, Call, Row, Table
from reference.flat import attributions

MAX_NAME_CHARS: Final = 256
MAX_LABEL_CHARS: Final = 1024
MAX_PATH_NAMES: Final = 64  # a path keeps its last 64 names
MAX_ROOT_BYTES: Final = 125  # a tree's root longer than this is not read
CUT: Final = "…"
CLIENT_KINDS: Final = (ProtoSpan.SPAN_KIND_CLIENT, ProtoSpan.SPAN_KIND_PRODUCER)
SERVER_KINDS: Final = (ProtoSpan.SPAN_KIND_SERVER, ProtoSpan.SPAN_KIND_CONSUMER)

SpanKey = tuple[bytes, bytes]  # (trace id, span id)


def cut(text: str, limit: int = MAX_NAME_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT)] + CUT


def label(names: Iterable[str]) -> str:
    """A cycle's label: its names joined by ``>``, each ``\\`` in them written ``\\\\`` and each ``>``
    ``\\>``, cut to its bound."""
    escaped = (name.replace("\\", "\\\\").replace(">", "\\>") for name in names)
    return cut(">".join(escaped), MAX_LABEL_CHARS)


def label_names(text: str) -> list[str]:
    """The names a label joins: split at each ``>`` no ``\\`` escapes, each ``\\x`` read as ``x``."""
    names: list[str] = []
    name: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            name.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ">":
            names.append("".join(name))
            name = []
        else:
            name.append(char)
    names.append("".join(name))
    return names


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """The facts detection reads of one span."""

    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    name: str
    kind: int
    scope: str
    start: int
    end: int
    attributes: dict[str, AnyValue]  # the first value of each key
    link: SpanKey | None  # the first span link

    @property
    def key(self) -> SpanKey:
        return (self.trace_id, self.span_id)

    @property
    def guard(self) -> bool:
        return self.scope == dialects.GUARD_SCOPE

    def text(self, key: str) -> str | None:
        value = self.attributes.get(key)
        return value.string_value if value is not None and value.HasField("string_value") else None

    def integer(self, key: str) -> int | None:
        value = self.attributes.get(key)
        return value.int_value if value is not None and value.HasField("int_value") else None

    def texts(self, key: str) -> list[str] | None:
        value = self.attributes.get(key)
        if value is None or not value.HasField("array_value"):
            return None
        return [item.string_value for item in value.array_value.values]

    @property
    def transfer(self) -> bool:
        """Whether the span marks its call as a transfer (a handoff)."""
        return (
            self.text(dialects.HOP_KIND) == "transfer" or self.text(dialects.TRANSFER_MODE) == "pass_control"
        )

    def call(self, table: Table = TABLE) -> Call | None:
        """The call this span records, its name cut to its bound; None when it is none."""
        text = {key: self.text(key) for key in self.attributes}
        call = table.call_of(self.name, self.scope, text)
        if call is None or call.name is None:
            return None
        return replace(call, name=cut(call.name))


def read(raw: bytes) -> list[Span]:
    """The spans of one ExportTraceServiceRequest, in the order they stand in it."""
    spans = []
    request = ExportTraceServiceRequest.FromString(raw)
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes: dict[str, AnyValue] = {}
                for pair in span.attributes:
                    attributes.setdefault(pair.key, pair.value)
                link = (span.links[0].trace_id, span.links[0].span_id) if span.links else None
                spans.append(
                    Span(
                        span.trace_id,
                        span.span_id,
                        span.parent_span_id,
                        span.name,
                        span.kind,
                        scope_spans.scope.name,
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        attributes,
                        link,
                    )
                )
    return spans


# --- paths ---------------------------------------------------------------------------------------


@dataclass(eq=False)
class CallNode:
    """One call (however many spans record it): where it stands, and who recorded it first."""

    trace_id: bytes
    names: tuple[str, ...]  # its path's names, its own last
    guard: bool  # first recorded by the inline guard's span
    tool: bool
    both: bool = False  # a tool's run recorded by the other source too: it counts for each
    runs: dict[str, CallNode] = field(default_factory=dict)  # of a tool: the agents it ran, by name


@dataclass(frozen=True)
class Entry:
    """A named ancestor on a path: the call, and what the same-call rule needs of its span."""

    name: str
    kind: str
    node: CallNode | None  # None: a hop of the guard's chain, or a caller named by its callee
    row: Row | None = None
    scope: str | None = None
    client: bool = False  # the client side of a remote call (CLIENT, PRODUCER)
    server: bool = False  # the server side (SERVER, CONSUMER)
    guard: bool = False  # the inline guard's span (or its chain)
    name_depth: int = 0
    caller: bool = False  # only the callee's gen_ai.caller.agent.name put it here
    transfer: bool = False  # a handoff: the entry before it waits for no answer


@dataclass(frozen=True)
class Path:
    entries: tuple[Entry, ...] = ()
    crossed: int = 0  # how many entries lie before the latest crossing into this trace

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(entry.name for entry in self.entries)

    def plus(self, entry: Entry) -> Path:
        entries = (*self.entries, entry)
        drop = max(0, len(entries) - MAX_PATH_NAMES)
        return Path(entries[drop:], max(0, self.crossed - drop))

    def without_last(self) -> Path:
        return Path(self.entries[:-1], min(self.crossed, len(self.entries) - 1))

    def with_last(self, entry: Entry) -> Path:
        return Path((*self.entries[:-1], entry), self.crossed)

    def across(self) -> Path:
        """The same path after it crossed into another trace."""
        return Path(self.entries, len(self.entries))


ROOT: Final = Path()


def same_call(above: Entry, below: Entry, repeats: int, table: Table = TABLE) -> bool:
    """Whether ``below``, named as ``above`` and directly under it, records the same call.

    ``repeats``: how often the name stands on the path above (for the guard's span).
    """
    if above.caller:
        return False  # the caller a remote agent named: another call by definition
    if below.guard:
        if below.kind == above.kind == TOOL and not above.guard:
            return True  # the guard's span of a tool call another instrumentation recorded first
        return below.name_depth <= repeats  # a new hop when its chain holds the name more often
    if above.guard:
        return True  # another instrumentation's span of the call the guard's span recorded
    if above.client or below.server:
        return True  # the two sides of a remote call
    if above.kind == AGENT and below.kind == TOOL:
        return False  # an agent that calls a tool named after itself
    if above.scope != below.scope:
        return True  # two instrumentations recording one call
    # One instrumentation: a wrapper read by another row is the call, the same form again (or a
    # wrapper's row inside the call it wraps) a new run.
    assert above.row is not None
    assert below.row is not None
    return not table.same_form_again(above.row, below.row)


LINK: Final = "a link (no call)"
RUN_OF_TOOL: Final = "the tool's run, in the agent's name"
AGAIN: Final = "one call"
NEW: Final = "a new call"


def step(last: Entry | None, entry: Entry, repeats: int, table: Table = TABLE) -> str:
    """What a call span (``entry``) is on a path that ends in ``last`` (None: it starts one),
    ``repeats`` how often its name stands on that path: a link (a call only first below a tool,
    elsewhere), a tool's run (an agent run directly below a tool call), the call above again, or
    a new call."""
    if last is None:
        return NEW
    assert entry.row is not None
    if entry.row.conditional and last.kind != TOOL:
        return LINK
    if last.kind == TOOL and entry.kind == AGENT:
        return RUN_OF_TOOL
    if last.name == entry.name and same_call(last, entry, repeats, table):
        return AGAIN
    return NEW


@dataclass(frozen=True)
class Return:
    """A name that came back on its path: a cycle, counted once per loop and trace."""

    trace_id: bytes
    order: tuple[int, bytes]  # (start, span id) of the span where the name returned
    kind: str
    loop: tuple[str, ...]  # the loop's names from its least rotation
    label: str


@dataclass
class Metrics:
    """The processor's counts, as plain dicts (keys as the detector's)."""

    cycles: dict[tuple[str, str], int]  # (kind, label)
    delegations: dict[tuple[str, str], int]  # (caller, callee)
    decisions: dict[tuple[str, str, str], int]  # (decision, reason, name)
    trees: dict[str, int]  # delegation tree root -> the largest hop count seen
    received: int
    duplicates: int
    # (kind, label) -> the (trace id, span id) of each count's span where the name returned, hex
    returns: dict[tuple[str, str], list[tuple[str, str]]]


class Detection:
    """The detection of one set of requests; :func:`detect` runs it."""

    def __init__(self, requests: Iterable[bytes], table: Table = TABLE) -> None:
        self.table = table
        self.spans: dict[SpanKey, Span] = {}
        self.received = self.duplicates = 0
        for raw in requests:
            for span in read(raw):
                self.received += 1
                if span.key in self.spans:
                    self.duplicates += 1
                else:
                    self.spans[span.key] = span
        self.paths: dict[SpanKey, Path] = {}
        self.nodes: list[CallNode] = []
        self.returns: list[Return] = []
        self.decisions: Counter[tuple[str, str, str]] = Counter()
        named = (key for key, span in self.spans.items() if span.call(table) is not None)
        # OpenLLMetry's flat runs, each the run of the tool span that provably started it.
        self.flat = attributions(self.spans, named)

    # Each span continues the path of the span it depends on: its parent (for a flat run the tool
    # span it is attributed to), or for a trace root the span it links to (unless the guard's chain
    # gives its earlier hops). Resolved without
    # recursion; a loop of parents or links is broken where it is found.

    def depends_on(self, span: Span) -> SpanKey | None:
        if span.key in self.flat:
            return self.flat[span.key]
        if span.parent_id:
            return (span.trace_id, span.parent_id)
        if span.link is not None and self.chain(span) is None:
            return span.link
        return None

    def path(self, key: SpanKey) -> Path:
        stack = [key]
        while stack:
            top = stack[-1]
            if top in self.paths:
                stack.pop()
                continue
            span = self.spans[top]
            on = self.depends_on(span)
            if on is not None and on in self.spans and on not in self.paths and on not in stack:
                stack.append(on)
                continue
            self.paths[top] = self.settle(span, self.paths.get(on) if on is not None else None)
            stack.pop()
        return self.paths[key]

    def base(self, span: Span, above: Path | None) -> Path:
        """The path a span continues: ``above`` is the path of the span it depends on, when that
        arrived (and is not in a loop with it)."""
        if span.parent_id:
            return above if above is not None else self.chain(span) or ROOT  # an orphan
        chain = self.chain(span)
        if chain is not None:
            return chain
        if span.link is not None:
            return above.across() if above is not None else ROOT
        call = span.call(self.table)
        # The caller a server's span names ran in the trace before; the caller an invoke_agent
        # CLIENT span names (the conventions' caller-aware refinement) in this one.
        named = ((name, key == dialects.CALLER) for key in dialects.CALLERS if (name := span.text(key)))
        caller = next(named, None)
        if call is not None and caller is not None:
            name, across = caller
            return Path((Entry(cut(name), AGENT, None, caller=True),), crossed=int(across))
        return ROOT

    def chain(self, span: Span) -> Path | None:
        """The earlier hops of the guard's chain that a guard span carries, as a path (``None`` for
        a lean span, a hop nested in the previous hop's span: its path is its parent's)."""
        call = span.call(self.table)
        if call is None or not any(key.startswith("otel_guard.") for key in span.attributes):
            return None
        agents = span.texts(dialects.CHAIN_AGENTS)
        if (span.integer(dialects.CHAIN_DEPTH) or 0) <= 1 or not agents:
            return None
        names = [cut(agent) for agent in agents]
        prior = names[:-1] if names[-1] == call.name else names
        if not prior:
            return None
        prior = prior[-MAX_PATH_NAMES:]
        return Path(tuple(Entry(name, AGENT, None, guard=True) for name in prior), len(prior))

    def settle(self, span: Span, above: Path | None) -> Path:
        base = self.base(span, above)
        call = span.call(self.table)
        if call is None:
            return base
        assert call.name is not None
        entry = Entry(
            call.name,
            call.kind,
            None,
            call.row,
            span.scope,
            client=span.kind in CLIENT_KINDS,
            server=span.kind in SERVER_KINDS,
            guard=span.guard,
            name_depth=max(span.integer(dialects.NAME_DEPTH) or 0, 0) if span.guard else 0,
            transfer=span.transfer,
        )
        last = base.entries[-1] if base.entries else None
        found = step(last, entry, base.names.count(entry.name), self.table)
        if found == LINK:
            return base
        self.decide(span, call.name)
        if found == RUN_OF_TOOL:
            return self.run_of_tool(span, entry, base)
        if found == AGAIN:  # one call: a transfer when any of its spans marks it as one
            assert last is not None
            return base.with_last(replace(entry, node=last.node, transfer=entry.transfer or last.transfer))
        self.returned(span, base, entry)
        return self.new_call(span, base, entry)

    def run_of_tool(self, span: Span, entry: Entry, below: Path) -> Path:
        """An agent run directly below a tool call: the tool's run, in the agent's name."""
        tool = below.entries[-1].node
        assert tool is not None
        # A transfer when the tool's span marks one (execute_tool transfer_to_X X, pass_control).
        entry = replace(entry, transfer=entry.transfer or below.entries[-1].transfer)
        base = below.without_last()
        self.returned(span, base, entry)
        ran = tool.runs.get(entry.name)
        if ran is not None:  # another span of the same run (Traceloop's task and agent)
            ran.both = ran.both or ran.guard != span.guard
            return base.plus(replace(entry, node=ran))
        path = self.new_call(span, base, entry)
        node = path.entries[-1].node
        assert node is not None
        tool.runs[entry.name] = node
        return path

    def new_call(self, span: Span, base: Path, entry: Entry) -> Path:
        names = base.plus(entry).names
        node = CallNode(span.trace_id, names, span.guard, entry.kind == TOOL)
        self.nodes.append(node)
        return base.plus(replace(entry, node=node))

    def returned(self, span: Span, path: Path, entry: Entry) -> None:
        """Note the cycle of ``entry``'s name if it stands on ``path`` where it still waits: from
        the latest such place. A place waits unless the place after it (for the last, ``entry``)
        is a transfer."""
        name, names = entry.name, path.names
        after = (*path.entries[1:], entry)
        waits = [at for at, place in enumerate(path.entries) if place.name == name and not after[at].transfer]
        if not waits:
            return
        at = waits[-1]
        if at < path.crossed:
            kind = "cross_trace"
        elif at == len(names) - 1:
            kind = "direct"
        else:
            kind = "cross_function"
        loop = names[at:]
        least = min(loop[i:] + loop[:i] for i in range(len(loop)))
        self.returns.append(
            Return(span.trace_id, (span.start, span.span_id), kind, least, label((*loop, name)))
        )

    def decide(self, span: Span, name: str) -> None:
        verdict = span.text(dialects.DECISION)
        if verdict is not None:
            reason = span.text(dialects.REASON) if verdict != "allow" else None
            self.decisions[(cut(verdict), cut(reason or ""), name)] += 1

    # --- counts ----------------------------------------------------------------------------------

    def metrics(self) -> Metrics:
        for key in sorted(self.spans, key=lambda key: (self.spans[key].start, key)):
            self.path(key)
        return Metrics(
            cycles=dict(self.cycles()),
            delegations=dict(self.delegations()),
            decisions=dict(self.decisions),
            trees=self.trees(),
            received=self.received,
            duplicates=self.duplicates,
            returns=self.exemplars(),
        )

    def counted_returns(self) -> list[Return]:
        """The first return of each loop (kind, least rotation) in each trace, by start time."""
        seen: set[tuple[bytes, str, tuple[str, ...]]] = set()
        counted = []
        for found in sorted(self.returns, key=lambda r: (r.trace_id, r.order)):
            if (found.trace_id, found.kind, found.loop) not in seen:
                seen.add((found.trace_id, found.kind, found.loop))
                counted.append(found)
        return counted

    def cycles(self) -> Counter[tuple[str, str]]:
        return Counter((found.kind, found.label) for found in self.counted_returns())

    def exemplars(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        exemplars: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
        for found in self.counted_returns():
            exemplars[(found.kind, found.label)].append((found.trace_id.hex(), found.order[1].hex()))
        return dict(exemplars)

    def delegations(self) -> Counter[tuple[str, str]]:
        """One edge per call, from its nearest named ancestor.

        Per trace, path of names and kind of call, the calls are counted per source -- the guard's
        spans and the others' -- and the larger count is the trace's (beside the guard, another
        instrumentation records the same calls, in spans beside the guard's). A tool's run that both
        sources recorded counts for each. A tool call that ran an agent counts there as well, but
        its edge is the agent's (caller -> agent), not its own.
        """
        calls: Counter[tuple[bytes, tuple[str, ...], bool, bool]] = Counter()
        ran: Counter[tuple[bytes, tuple[str, ...], bool, bool]] = Counter()
        for node in self.nodes:
            calls[(node.trace_id, node.names, node.tool, node.guard)] += 1
            if node.both:
                calls[(node.trace_id, node.names, node.tool, not node.guard)] += 1
            ran[(node.trace_id, node.names, node.tool, node.guard)] += bool(node.tool and node.runs)
        edges: Counter[tuple[str, str]] = Counter()
        for trace_id, names, tool in {key[:3] for key in calls}:
            if len(names) > 1:
                made = max(calls[(trace_id, names, tool, guard)] for guard in (False, True))
                taken = max(ran[(trace_id, names, tool, guard)] for guard in (False, True))
                edges[(names[-2], names[-1])] += made - taken
        return +edges

    def trees(self) -> dict[str, int]:
        """The largest hop count of each delegation tree, from the guard's spans."""
        trees: dict[str, int] = {}
        for span in self.spans.values():
            hops = span.integer(dialects.TREE_HOPS)
            root = span.text(dialects.CHAIN_ROOT)
            if span.guard and hops and hops > 0 and root and len(root.encode()) <= MAX_ROOT_BYTES:
                trees[root] = max(trees.get(root, 0), hops)
        return trees


def detect(requests: Sequence[bytes], table: Table = TABLE) -> Metrics:
    """What the processor counts of these OTLP trace requests (protobuf bytes), in this order,
    reading calls by ``table``."""
    return Detection(requests, table).metrics()
