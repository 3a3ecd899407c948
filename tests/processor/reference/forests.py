"""Span forests for the differential tests: trees of agent calls, drawn by hypothesis, as spans.

A :class:`Call` tree says who calls whom (an agent run, perhaps through a tool call, perhaps in
another process or trace); :func:`render` writes it as the spans one runtime or instrumentation per
process would (its *style*), and :func:`requests` as the OTLP requests a pipeline may deliver: in
any order, any batches, some sent twice, some spans lost, KeyValues written key first or value first.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import count

from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from processor_spans import AttributeValue, any_value, length_delimited, value_first

AGENTS = ("planner", "budget", "fx", "p" * 300)  # one name past the bound of 256 characters
TOOLS = ("ask_budget", "ask_planner", "search")
PLAIN_TOOLS = ("search", "lookup")  # tools that run no agent
HOPS = ("in_process", "in_process", "http", "remote", "link", "chain", "caller")
# Styles both the detector and the reference read (the differential tests).
STYLES = ("genai", "genai_attributes", "openinference", "oi_langchain", "traceloop", "guard", "guard_runtime")
# The styles of the two failures the reference fixes (Google ADK's, CrewAI under OpenLLMetry).
FIXED_STYLES = ("adk", "crewai_tl")
SCOPES = {
    "genai": "pydantic-ai",
    "genai_attributes": "strands.telemetry.tracer",
    "openinference": "openinference.instrumentation.openai_agents",
    "oi_langchain": "openinference.instrumentation.langchain",
    "traceloop": "opentelemetry.instrumentation.langchain",
    "guard": "otel_guard",
    "guard_runtime": "otel_guard",
    "guard_runtime_tools": "otel_guard",
    "adk": "gcp.vertex.agent",
    "crewai_tl": "opentelemetry.instrumentation.crewai.instrumentation",
    "http": "opentelemetry.instrumentation.httpx",  # HTTP and messaging spans, no calls
}
ROOTS = ("ab" * 16, "short-root", "cd" * 16)
HTTP: dict[str, AttributeValue] = {"http.request.method": "POST"}


@dataclass
class Call:
    """An agent run: through a tool call (``via``) or not, reached by ``hop``, with its own calls."""

    agent: str
    via: str | None = None
    hop: str = "in_process"
    style: str | None = None  # a new process's style (hops other than in_process), else its caller's
    calls: list[Call] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)  # tool calls that run no agent


def calls(styles: tuple[str, ...], depth: int = 4, hops: tuple[str, ...] = HOPS) -> st.SearchStrategy[Call]:
    """Call trees of at most ``depth`` levels, each process in one of ``styles``."""

    @st.composite
    def tree(draw: st.DrawFn, depth: int) -> Call:
        below = draw(st.lists(tree(depth - 1), max_size=2)) if depth > 1 else []
        # A tool named like an agent that its caller runs otherwise stands at that agent's path
        # (KNOWN_FOREST_DIFFERENCES): such tools are named as the agent they run, with ask_.
        agents = [c.agent for c in below]
        for c in below:
            if c.via in agents and (c.via != c.agent or agents.count(c.via) > 1):
                c.via = f"ask_{c.agent}"
        tools = [tool for tool in PLAIN_TOOLS if tool not in agents]
        return Call(
            agent=draw(st.sampled_from(AGENTS if depth == 2 else AGENTS[:3])),
            via=draw(st.none() | st.sampled_from(TOOLS + AGENTS[:3])),
            hop=draw(st.sampled_from(hops)),
            style=draw(st.sampled_from(styles)),
            calls=below,
            tools=draw(st.lists(st.sampled_from(tools), max_size=1)),
        )

    return tree(depth)


@dataclass
class Context:
    """Where a call is written: its trace, its process's style, the guard's chain so far."""

    trace_id: bytes
    style: str
    chain: tuple[str, ...] = ()
    root: str = ROOTS[0]
    caller: str | None = None  # the agent that called, by name
    arriving: bool = False  # the call came from another process (its first hop: an arriving one)


class Forest:
    """Spans written in order of their start (a counter): ``spans`` as (scope, span).

    ``lean``: the guard's spans are lean as the guard writes them (docs/spec.md §9): a hop directly
    under the previous hop's span, allowed and not arriving, leaves ``otel_guard.chain.agents`` out.
    """

    def __init__(self, lean: bool = True) -> None:
        self.lean = lean
        self.chains: dict[bytes, tuple[str, ...]] = {}  # the guard's span id -> its hop's chain
        self.spans: list[tuple[str, Span]] = []
        self._ids = count(1)
        self._clock = count(1_700_000_000_000_000_000, 1000)
        self.hops: dict[str, int] = {}  # tree root -> hops used

    def trace_id(self) -> bytes:
        return next(self._ids).to_bytes(16, "big")

    def span(
        self,
        context: Context,
        name: str,
        parent: Span | None,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        kind: Span.SpanKind.ValueType = Span.SPAN_KIND_INTERNAL,
        link: Span | None = None,
        style: str | None = None,
    ) -> Span:
        start = next(self._clock)
        span = Span(
            trace_id=context.trace_id,
            span_id=next(self._ids).to_bytes(8, "big"),
            parent_span_id=parent.span_id if parent is not None else b"",
            name=name,
            kind=kind,
            start_time_unix_nano=start,
            end_time_unix_nano=start + 500,
        )
        for key, value in (attributes or {}).items():
            span.attributes.append(KeyValue(key=key, value=any_value(value)))
        if link is not None:
            span.links.add(trace_id=link.trace_id, span_id=link.span_id)
        self.spans.append((SCOPES[style or context.style], span))
        return span

    def guard_hop(self, context: Context, name: str, parent: Span | None, tool: bool) -> tuple[Span, Context]:
        """The inline guard's span of one hop (observe mode), and the context below it."""
        chain = (*context.chain, name)
        hops = self.hops[context.root] = self.hops.get(context.root, 0) + 1
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "execute_tool" if tool else "invoke_agent",
            "gen_ai.tool.name" if tool else "gen_ai.agent.name": name,
            "otel_guard.chain.agents": list(chain),
            "otel_guard.chain.skills": [""] * len(chain),
            "otel_guard.chain.depth": len(chain),
            "otel_guard.name_depth": chain.count(name),
            "otel_guard.chain.root": context.root,
            "otel_guard.budget.hops": hops,
            "otel_guard.decision": "would_refuse" if name in context.chain else "allow",
            "otel_guard.mode": "observe",
        }
        if name in context.chain:
            attributes["otel_guard.reason"] = "cycle"
        elif (
            self.lean
            and parent is not None
            and not context.arriving
            and self.chains.get(parent.span_id) == context.chain
        ):
            del attributes["otel_guard.chain.agents"], attributes["otel_guard.chain.skills"]
        span_name = f"{'execute_tool' if tool else 'invoke_agent'} {name}"
        below = Context(context.trace_id, context.style, chain, context.root)
        span = self.span(context, span_name, parent, attributes)
        self.chains[span.span_id] = chain
        return span, below


def render(forest: Forest, call: Call, parent: Span | None, context: Context) -> None:
    """Write ``call`` (and its calls) below ``parent`` (None: it starts a trace)."""
    style = context.style
    # Within a trace, guarded processes call guarded ones, unguarded unguarded ones: where the
    # guard's spans and others' record different calls at one path, the detector's counts depend
    # on arrival order (KNOWN_FOREST_DIFFERENCES; corpus/beside holds the guard's spans beside
    # others' of the same calls).
    crossing = call.hop in ("http", "remote")
    if (
        call.hop != "in_process"
        and call.style is not None
        and (not crossing or call.style.startswith("guard") == style.startswith("guard"))
    ):
        style = call.style
    context = Context(context.trace_id, style, context.chain, context.root, context.caller, crossing)
    if parent is not None and call.hop == "http":
        client = forest.span(context, "POST", parent, HTTP, kind=Span.SPAN_KIND_CLIENT, style="http")
        parent = forest.span(context, "POST /a2a", client, HTTP, kind=Span.SPAN_KIND_SERVER, style="http")
    elif parent is not None and (
        call.hop == "link" or (call.hop == "chain" and not style.startswith("guard"))
    ):
        producer = forest.span(context, "publish tasks", parent, kind=Span.SPAN_KIND_PRODUCER, style="http")
        context = Context(forest.trace_id(), style, context.chain, context.root, context.caller)
        parent = forest.span(
            context, "process tasks", None, kind=Span.SPAN_KIND_CONSUMER, link=producer, style="http"
        )
    elif parent is not None and call.hop in ("chain", "caller"):
        context = Context(forest.trace_id(), style, context.chain, context.root, context.caller)
        parent = None  # the call starts a trace: its guard span carries the chain, or names its caller
    via = call.via
    if style.startswith("guard") and via == call.agent:
        via = (
            f"ask_{via}"  # (a tool named like the agent it runs, beside the guard: KNOWN_FOREST_DIFFERENCES)
        )
    if via is not None:
        parent, context = TOOL_WRITERS[style](forest, via, parent, context)
    inner, context = AGENT_WRITERS[style](forest, call, parent, context)
    context = Context(context.trace_id, context.style, context.chain, context.root, call.agent)
    for tool in call.tools:
        TOOL_WRITERS[context.style](forest, tool, inner, context)
    for below in call.calls:
        render(forest, below, inner, context)


Writer = Callable[..., tuple[Span, Context]]


def _agent(forest: Forest, call: Call, parent: Span | None, context: Context) -> tuple[Span, Context]:
    """An agent run in its process's style; the span its own calls go below."""
    name, style = call.agent, context.style
    genai = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name}
    root_attributes: dict[str, AttributeValue] = {}
    if parent is None and context.caller is not None and call.hop == "caller":
        root_attributes["gen_ai.caller.agent.name"] = context.caller
    if style.startswith("guard"):
        if root_attributes:  # a server that names its caller: the runtime's span of it
            server = Span.SPAN_KIND_SERVER
            attributes = {**genai, **root_attributes}
            return forest.span(
                context, f"invoke_agent {name}", None, attributes, kind=server, style="genai"
            ), context
        span, below = forest.guard_hop(context, name, parent, tool=False)
        if style != "guard":  # the runtime's own span of the call, inside the guard's
            span = forest.span(below, f"invoke_agent {name}", span, genai, style="genai")
        return span, below
    if style == "genai":
        if call.hop == "remote" and parent is not None:
            client = forest.span(context, f"invoke_agent {name}", parent, genai, kind=Span.SPAN_KIND_CLIENT)
            parent = forest.span(context, "POST", client, HTTP, kind=Span.SPAN_KIND_CLIENT, style="http")
            kind = Span.SPAN_KIND_SERVER
        else:
            kind = Span.SPAN_KIND_SERVER if root_attributes else Span.SPAN_KIND_INTERNAL
        return forest.span(
            context, f"invoke_agent {name}", parent, {**genai, **root_attributes}, kind=kind
        ), context
    if style == "genai_attributes":
        return forest.span(context, "agent run", parent, {**genai, **root_attributes}), context
    if style == "openinference":
        workflow = forest.span(context, "Agent workflow", parent, {"openinference.span.kind": "CHAIN"})
        span = forest.span(
            context,
            name,
            workflow,
            {"openinference.span.kind": "AGENT", "agent.name": name, **root_attributes},
        )
        return forest.span(context, "turn", span, {"openinference.span.kind": "CHAIN"}), context
    if style == "oi_langchain":
        graph = forest.span(context, name, parent, {"openinference.span.kind": "CHAIN", **root_attributes})
        node = forest.span(context, "model", graph, {"openinference.span.kind": "CHAIN"})
        forest.span(context, "call_model", node, {"openinference.span.kind": "CHAIN"})
        forest.span(context, "agent", graph, {"openinference.span.kind": "AGENT"})  # LangChain's guess
        return forest.span(context, "tools", graph, {"openinference.span.kind": "CHAIN"}), context
    if style == "traceloop":
        task = {"traceloop.span.kind": "task", "gen_ai.operation.name": "execute_task"}
        if call.via is not None:  # the run of a tool: its agent span and its task, side by side
            forest.span(context, f"invoke_agent {name}", parent, genai)
            graph = forest.span(
                context, f"execute_task {name}", parent, {**task, "traceloop.entity.name": name}
            )
        else:
            outer = forest.span(context, f"invoke_agent {name}", parent, {**genai, **root_attributes})
            graph_run = {"traceloop.span.kind": "workflow", "traceloop.entity.name": name, **genai}
            graph = forest.span(context, f"{name}.workflow", outer, graph_run)
        forest.span(context, "execute_task model", graph, {**task, "traceloop.entity.name": "model"})
        return forest.span(
            context, "execute_task tools", graph, {**task, "traceloop.entity.name": "tools"}
        ), context
    if style == "adk":
        run = {"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": name}
        workflow = forest.span(context, f"invoke_workflow {name}", parent, run)
        span = forest.span(context, f"invoke_agent {name}", workflow, genai)
        model = {"gen_ai.operation.name": "generate_content", "gen_ai.agent.name": name}
        forest.span(context, "generate_content scripted", span, model)
        return span, context
    assert style == "crewai_tl"
    crew = forest.span(context, "crewai.workflow", parent, {"gen_ai.operation.name": "invoke_agent"})
    unnamed_task = {"traceloop.span.kind": "task", "gen_ai.operation.name": "invoke_agent"}
    crew_task = forest.span(context, f"Answer from {context.caller}.task", crew, unnamed_task)
    return forest.span(
        context, f"{name}.agent", crew_task, {"traceloop.span.kind": "agent", **genai}
    ), context


def _tool(forest: Forest, name: str, parent: Span | None, context: Context) -> tuple[Span, Context]:
    """A tool call in its process's style; the span an agent it runs goes below."""
    style = context.style
    genai = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if style.startswith("guard"):
        span, below = forest.guard_hop(context, name, parent, tool=True)
        if style == "guard_runtime_tools":  # (not drawn: KNOWN_FOREST_DIFFERENCES)
            span = forest.span(below, f"execute_tool {name}", span, genai, style="genai")
        return span, below
    if style in ("genai", "adk"):
        return forest.span(context, f"execute_tool {name}", parent, genai), context
    if style == "genai_attributes":
        return forest.span(context, "tool run", parent, genai), context
    if style in ("openinference", "oi_langchain"):
        return forest.span(
            context, name, parent, {"openinference.span.kind": "TOOL", "tool.name": name}
        ), context
    if style == "traceloop":
        attributes = {"traceloop.span.kind": "tool", "traceloop.entity.name": name, **genai}
        return forest.span(context, f"execute_tool {name}", parent, attributes), context
    assert style == "crewai_tl"
    assert parent is not None
    return parent, context  # CrewAI's tool calls make no span


AGENT_WRITERS: dict[str, Writer] = dict.fromkeys(SCOPES, _agent)
TOOL_WRITERS: dict[str, Writer] = dict.fromkeys(SCOPES, _tool)


def spans_of(call: Call, style: str, root: str = ROOTS[0], lean: bool = True) -> list[tuple[str, Span]]:
    """The spans of one call tree, its first process in ``style``, in the order they started
    (``lean``: the guard's spans as :class:`Forest` says)."""
    forest = Forest(lean)
    top = Call(call.agent, None, "in_process", style, call.calls, call.tools)
    render(forest, top, None, Context(forest.trace_id(), style, root=root))
    return forest.spans


# --- delivery ------------------------------------------------------------------------------------


def encode(spans: list[tuple[str, Span]], value_first_pairs: bool) -> bytes:
    """One request of ``spans``, a ScopeSpans per scope in the order first seen."""
    scopes: dict[str, list[Span]] = {}
    for scope, span in spans:
        scopes.setdefault(scope, []).append(span)
    if not value_first_pairs:
        request = ExportTraceServiceRequest()
        resource_spans = request.resource_spans.add()
        for scope, members in scopes.items():
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = scope
            scope_spans.spans.extend(members)
        return request.SerializeToString()
    body = b"".join(
        length_delimited(
            2,
            length_delimited(1, length_delimited(1, scope.encode()))
            + b"".join(length_delimited(2, value_first(span)) for span in members),
        )
        for scope, members in scopes.items()
    )
    return length_delimited(1, body)


@dataclass
class Delivery:
    """How a pipeline delivers a forest's spans."""

    order: str  # "started", "ended" (children first, as exporters send) or "shuffled"
    batches: int
    value_first: list[bool]  # per request
    again: int | None  # a request sent twice (a retry), by index
    lost: list[int]  # spans never sent, by index
    seed: int


deliveries = st.builds(
    Delivery,
    order=st.sampled_from(("started", "ended", "shuffled")),
    batches=st.integers(1, 8),
    value_first=st.lists(st.booleans(), min_size=8, max_size=8),
    again=st.none() | st.integers(0, 7),
    lost=st.lists(st.integers(0, 200), max_size=2) | st.just([]),
    seed=st.integers(0, 2**16),
)


def requests(spans: list[tuple[str, Span]], delivery: Delivery, keep_linked: bool = True) -> list[bytes]:
    """The requests that deliver ``spans`` as ``delivery`` says.

    A span lost above one that another trace links to leaves the linking trace's root waiting for
    as long as the linked trace is held (KNOWN_FOREST_DIFFERENCES): unless ``keep_linked`` is
    false, such spans are not lost.
    """
    by_id = {(span.trace_id, span.span_id): span for _, span in spans}
    kept = set()
    for _, span in spans if keep_linked else ():
        for link in span.links:
            at = by_id.get((link.trace_id, link.span_id))
            while at is not None:
                kept.add(id(at))
                at = by_id.get((at.trace_id, at.parent_span_id))
    sent = [pair for index, pair in enumerate(spans) if index not in delivery.lost or id(pair[1]) in kept]
    if delivery.order == "ended":
        sent.reverse()
    elif delivery.order == "shuffled":
        random.Random(delivery.seed).shuffle(sent)
    size = max(1, -(-len(sent) // delivery.batches))
    batches = [sent[at : at + size] for at in range(0, len(sent), size)] or [[]]
    raws = [encode(batch, delivery.value_first[n % 8]) for n, batch in enumerate(batches)]
    if delivery.again is not None:
        raws.append(raws[delivery.again % len(raws)])
    return raws
