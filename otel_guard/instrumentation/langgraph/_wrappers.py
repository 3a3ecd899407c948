"""The patches of the LangGraph instrumentation: which call is which hop, and what a refusal returns.

Three kinds of call are hops:

* a graph run (``Pregel.stream`` / ``astream``, which ``invoke`` / ``ainvoke`` consume) is
  ``invoke_agent {graph name}``; a graph left with LangGraph's default name ``"LangGraph"`` (an
  unnamed subgraph, say) is not an agent and makes no hop, so two unnamed graphs are never taken
  for one agent calling itself;
* a tool call (``BaseTool.run`` / ``arun``, which ``ToolNode`` reaches through ``invoke``) is
  ``execute_tool {tool name}``;
* a ``RemoteGraph`` run is a client hop ``invoke_agent {name}`` whose request headers carry the chain
  (W3C ``baggage``) and ``traceparent`` to the server.

One delegation is one hop. The innermost hop this instrumentation opened is remembered in the
OpenTelemetry context, so a graph (or remote graph) run directly by a tool of the same name joins
that tool's hop instead of standing in the chain twice. A graph run whose arriving chain already
ends with its name, a hop this instrumentation did not open, was delegated by someone else: by
another process (the hop is checked again, ``receiving``) or by other code in this process that
opened the hop's span (the run joins it).

A refused tool call, or a refusal raised anywhere inside a tool, becomes what the tool returns: a
``ToolMessage`` with ``status="error"`` and :func:`refusal_text` when the call came from a model, so
``ToolNode`` hands it to the model and the graph goes on; so does the tree budget's refusal of a model
request made inside the tool (:class:`~._usage.TreeBudgetExceeded`, raised in the tool's own graph),
and the caller's next request, in the same spent tree, ends its run. So does a refused handoff: a tool's
``Command(goto=..., graph=Command.PARENT)`` is a transfer into the node it names (:mod:`._handoffs`).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, NamedTuple
from urllib.parse import quote

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.types import Command
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue

from otel_guard.chain import Chain
from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, chain_in, delegate
from otel_guard.instrumentation._base import acall_in_hop, refusal_text, unless_suppressed
from otel_guard.instrumentation.langgraph._handoffs import (
    HANDOFFS,
    Handoffs,
    ahand_over,
    hand_over,
    with_chain_of,
)
from otel_guard.instrumentation.langgraph._streams import (
    StepContext,
    ainvoke_in_hop,
    astream_in_hop,
    invoke_in_hop,
    invoked,
    stream_in_hop,
)
from otel_guard.instrumentation.langgraph._usage import TreeBudgetExceeded
from otel_guard.instrumentation.langgraph._waiting import WAITING, Pending, finish, wait
from otel_guard.telemetry import (
    CHAIN_BAGGAGE_KEY,
    EXECUTE_TOOL,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_TOOL_CALL_ID,
    INVOKE_AGENT,
)

DEFAULT_GRAPH_NAME: Final = "LangGraph"
"""The name LangGraph gives a graph compiled without one: not an agent's name."""


_OPENINFERENCE_LANGCHAIN: Final = "openinference.instrumentation.langchain"
"""OpenInference's LangChain instrumentation, whose spans the hops' spans are put under."""

_OPEN_HOP: Final = context.create_key("otel_guard.langgraph.open_hop")
"""Context key of the innermost hop this instrumentation opened (an :class:`_OpenHop`)."""

_PENDING_HOP: Final = context.create_key("otel_guard.langgraph.pending_hop")
"""Context key of a hop decided before its LangChain run began (a :class:`Pending`)."""

Wrapped = Callable[..., Any]


# -- where a run stands -------------------------------------------------------------------------


class _OpenHop(NamedTuple):
    """The innermost hop this instrumentation opened, and the chain it put in force."""

    kind: str  # "tool" or "graph"
    name: str
    chain: Chain | None


def _with_open_hop(
    ctx: context.Context, kind: str, name: str, chain: Chain | None, pending: Pending | None = None
) -> context.Context:
    """``ctx`` with the hop as the innermost open one (and ``pending`` as the hop whose span waits
    for its run: :func:`_entered`), in one copy."""
    if pending is None:
        return context.set_value(_OPEN_HOP, _OpenHop(kind, name, chain), ctx)
    return context.Context({**ctx, _OPEN_HOP: _OpenHop(kind, name, chain), _PENDING_HOP: pending})


# -- spans that follow LangChain's run tree -------------------------------------------------------
#
# LangChain tracers (OpenInference's, Traceloop's) make the span of a tool or graph run when the run
# begins, in its ``on_tool_start`` / ``on_chain_start`` callback, and parent their spans by the run
# tree. A hop's span started before that callback would stand *beside* the tracer's span of the same
# call. So a hop is decided before the call (a refused call never begins) and its span is started
# once the call's own run has begun: under the tracer's span of that run.


def _openinference() -> Any:
    """OpenInference's LangChain instrumentation module while it instruments, else ``None``."""
    module = sys.modules.get(_OPENINFERENCE_LANGCHAIN)
    if module is None:
        return None
    try:
        return module if module.LangChainInstrumentor().is_instrumented_by_opentelemetry else None
    except Exception:  # another package's API: it never costs a hop
        return None


def _openinference_span(read: Callable[[Any], object]) -> trace.Span | None:
    """The recording span ``read(OpenInference's module)`` gives, or ``None`` (not instrumenting, no
    such span, or its API failed)."""
    module = _openinference()
    if module is None:
        return None
    try:
        span = read(module)
    except Exception:  # another package's API: it never costs a hop
        return None
    return span if isinstance(span, trace.Span) and span.is_recording() else None


def _run_span(run_id: object) -> trace.Span | None:
    """The span a LangChain tracer made for the run ``run_id`` (OpenInference's), if any."""
    if _OPENINFERENCE_LANGCHAIN not in sys.modules:  # the usual case, asked at every hop
        return None
    return _openinference_span(lambda module: module.LangChainInstrumentor().get_span(run_id))


def _waiting(event: str) -> Delegation | None:
    """The hop decided for the run of ``event`` that waits for its span, or ``None``.

    Asked at a LangChain run's start (a graph's every node is one) when some hop waits somewhere;
    the run-start wrappers test :data:`WAITING` themselves first, inline.
    """
    pending = context.get_current().get(_PENDING_HOP)
    if type(pending) is not Pending or pending.event != event:
        return None
    hop = pending.hop
    return hop if hop.span is trace.INVALID_SPAN else None  # not opened yet


def _entered(hop: Delegation, run_manager: object) -> object:
    """Open ``hop``, decided for the run that just began, and attach its context.

    The first run that begins after a hop was decided is the call's own (``BaseTool.run`` and
    ``Pregel.stream`` start their run before anything else), so it is the one the span goes under:
    the tracer's span of it when the tracer keeps one by run id, else the span now current (a tracer
    that makes its spans current, as Traceloop's does, has just made its span of the run current).
    It is attached in the context the call runs in: a tool's body runs in a copy of that context
    made after this callback, and the steps of a graph's stream go on in it (:mod:`._streams`);
    the hop's wrapper (or the stream's step) resets the context when the call ends.

    The hop's context leaves the waiting entry out: it holds the hop, and a hop whose own context
    held it would be a reference cycle (the span, its attributes and the chain left to the garbage
    collector after every call, where a bare call frees them at once).
    """
    WAITING.discard(hop)
    current = context.get_current()
    span = _run_span(getattr(run_manager, "run_id", None))
    parent = context.set_value(_PENDING_HOP, None, current)
    context.attach(hop.open(trace.set_span_in_context(span, parent) if span is not None else parent))
    return run_manager


def tool_run_started(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``CallbackManager.on_tool_start``: the tool's run has begun; its hop's span starts under it."""
    run_manager = wrapped(*args, **kwargs)
    if not WAITING:  # no hop waits anywhere (nearly always): no call made
        return run_manager
    hop = _waiting("tool")
    return run_manager if hop is None else _entered(hop, run_manager)


async def tool_arun_started(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``AsyncCallbackManager.on_tool_start``: as :func:`tool_run_started`."""
    run_manager = await wrapped(*args, **kwargs)
    if not WAITING:  # no hop waits anywhere (nearly always): no call made
        return run_manager
    hop = _waiting("tool")
    return run_manager if hop is None else _entered(hop, run_manager)


def chain_run_started(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``CallbackManager.on_chain_start``: a graph's run has begun; its hop's span starts under it."""
    run_manager = wrapped(*args, **kwargs)
    if not WAITING:  # no hop waits anywhere (nearly always): no call made
        return run_manager
    hop = _waiting("chain")
    return run_manager if hop is None else _entered(hop, run_manager)


async def chain_arun_started(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``AsyncCallbackManager.on_chain_start``: as :func:`chain_run_started`."""
    run_manager = await wrapped(*args, **kwargs)
    if not WAITING:  # no hop waits anywhere (nearly always): no call made
        return run_manager
    hop = _waiting("chain")
    return run_manager if hop is None else _entered(hop, run_manager)


def _hop_span_is_current(name: str) -> bool:
    """Whether the current span is a hop span of ``name`` started in this process."""
    span = trace.get_current_span()
    return span.is_recording() and getattr(span, "name", None) in (
        f"{INVOKE_AGENT} {name}",
        f"{EXECUTE_TOOL} {name}",
    )


def _in_langchain_run(ctx: context.Context) -> context.Context:
    """``ctx`` with OpenInference's span of the LangChain run the call is made in as its span.

    OpenInference's LangChain instrumentation parents its spans by LangChain's run tree and never
    makes them current, so a hop's span would start under the last span that is current (the
    graph's hop) and the guard's spans would make a subtree of their own beside OpenInference's. Its
    ``get_current_span()`` names the span of the current run: the hop's span goes under it, in the
    trace where OpenInference shows the call. Instrumentations that make their spans current
    (Traceloop's) need nothing. Baggage, and with it the chain, stay those of ``ctx``.
    """
    if _OPENINFERENCE_LANGCHAIN not in sys.modules:  # the usual case, asked at every hop
        return ctx
    span = _openinference_span(lambda module: module.get_current_span())
    if span is None:
        return ctx
    current_span = trace.get_current_span(ctx)
    current = current_span.get_span_context()
    if current.is_valid and current.trace_id != span.get_span_context().trace_id:
        return ctx  # the current span is of another trace: the run's span is not an ancestor
    parent = getattr(current_span, "parent", None)
    if isinstance(parent, trace.SpanContext) and parent.span_id == span.get_span_context().span_id:
        return ctx  # the current span (a hop's, opened under the run's span) is already inside it
    return trace.set_span_in_context(span, ctx)


def _in_run(step: Callable[[], context.Context]) -> context.Context:
    """``step()`` (a hop's ``start`` or ``decide``) under the span of the LangChain run the call is
    made in (see above). Decided only, an allowed hop's span waits for the call's own run
    (:func:`_entered`); a refused hop's span goes there at once."""
    current = context.get_current()
    ctx = _in_langchain_run(current)
    if ctx is current:  # no such span (no OpenInference): nothing to attach
        return step()
    token = context.attach(ctx)
    try:
        return step()
    finally:
        context.detach(token)


async def _ain_run(step: Callable[[], Awaitable[context.Context]]) -> context.Context:
    """:func:`_in_run` for a step that is awaited (``astart``, ``adecide``)."""
    current = context.get_current()
    ctx = _in_langchain_run(current)
    if ctx is current:
        return await step()
    token = context.attach(ctx)
    try:
        return await step()
    finally:
        context.detach(token)


def _run_span_comes_after() -> bool:
    """Whether a graph run's hop span waits for the run's tracer span (see :func:`_entered`).

    It does, except where OpenInference traces a top-level run: OpenInference puts the span of a
    run without a parent run under the current span, so the hop's span, started first, is its
    parent and the tree is one. Inside a run (a graph a tool runs) OpenInference, like Traceloop
    always, parents the run's span by the run tree, and the hop's span goes under it.
    """
    module = _openinference()
    if module is None:
        return True
    try:
        return isinstance(module.get_current_span(), trace.Span)
    except Exception:  # another package's API: it never costs a hop
        return True


def _graph_step_context(
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    span_kind: SpanKind,
    remote: bool,
    node: str | None = None,
) -> StepContext:
    """Open (or join) the hop of a graph run named ``name`` (the run of ``node`` in the graph that
    runs it, if any); called at the stream's first step."""
    found = _graph_hop(name, attributes, span_kind, remote, node)
    if not isinstance(found, Delegation):
        return found
    decided = _decided_first(remote)
    return _graph_hop_context(name, found, _in_run(found.decide if decided else found.start), decided)


async def _agraph_step_context(
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    span_kind: SpanKind,
    remote: bool,
    node: str | None = None,
) -> StepContext:
    """:func:`_graph_step_context` for an async stream: the hop's budget store is awaited."""
    found = _graph_hop(name, attributes, span_kind, remote, node)
    if not isinstance(found, Delegation):
        return found
    decided = _decided_first(remote)
    ctx = await _ain_run(found.adecide if decided else found.astart)
    return _graph_hop_context(name, found, ctx, decided)


def _graph_hop(
    name: str,
    attributes: Mapping[str, AttributeValue] | None,
    span_kind: SpanKind,
    remote: bool,
    node: str | None = None,
) -> StepContext | Delegation:
    """The hop a graph run named ``name`` joins (its step context), or the new hop it makes."""
    parent = context.get_current()
    handoffs = parent.get(HANDOFFS)
    if type(handoffs) is Handoffs and not remote and (handed := handoffs.take(node, name)) is not None:
        # A handoff tool of the agent before decided this run: the transfer is its hop.
        return _transferred(name, handed, parent)
    opened = parent.get(_OPEN_HOP)
    chain = chain_in(parent)
    ours = isinstance(opened, _OpenHop) and opened.chain == chain
    if ours and opened == _OpenHop("tool", name, chain):
        # The tool of this name *is* this run (agent-as-tool, a tool that runs this graph): one hop.
        return _with_open_hop(parent, "graph", name, chain), None
    receiving = False
    if not ours and chain is not None and chain.hops[-1].agent == name:
        # The hop into this graph was opened outside this instrumentation.
        if _hop_span_is_current(name):
            # By code in this process (another adapter, @agentic, delegate): join it.
            return _with_open_hop(parent, "graph", name, chain), None
        # By the caller's process, which sent the chain: check the hop again, do not add it twice.
        receiving = not remote
    return delegate(name, kind="agent", span_kind=span_kind, receiving=receiving, attributes=attributes)


def _transferred(name: str, hop: Delegation, parent: context.Context) -> StepContext:
    """The step context of a graph run that a handoff's transfer (``hop``, decided in the agent that
    handed off) starts: that agent's chain, this run's place; the span opens as a graph hop's does."""
    ctx = with_chain_of(parent, hop)
    if _decided_first(remote=False):
        return _with_open_hop(ctx, "graph", name, hop.chain, wait("chain", hop)), hop
    return _with_open_hop(hop.open(ctx), "graph", name, hop.chain), hop


def _decided_first(remote: bool) -> bool:
    """Whether a new graph hop is decided now and its span started with the graph's run, under
    the tracer's span of that run (a refused graph never runs). A remote graph's span starts now:
    its request carries it."""
    return not remote and _run_span_comes_after()


def _graph_hop_context(name: str, hop: Delegation, ctx: context.Context, decided: bool) -> StepContext:
    """The step context of a new graph hop, started (or only decided) in ``ctx``."""
    if decided:
        return _with_open_hop(ctx, "graph", name, hop.chain, wait("chain", hop)), hop
    return _with_open_hop(ctx, "graph", name, hop.chain), hop


def _entering(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], span_kind: SpanKind, remote: bool
) -> Callable[[], StepContext]:
    """What opens the hop at the stream's first step, in the context the stream was called in.

    A stream may be consumed later or elsewhere (another thread, LangGraph's v3 event streams): the
    hop still belongs to the caller that started the run.
    """
    parent = context.get_current()
    attributes = _conversation_attributes(args, kwargs)
    node = _node_name(args, kwargs)

    def enter() -> StepContext:
        if context.get_current() is parent:  # consumed where it was called (the usual case)
            return _graph_step_context(name, attributes, span_kind, remote, node)
        token = context.attach(parent)
        try:
            return _graph_step_context(name, attributes, span_kind, remote, node)
        finally:
            context.detach(token)

    return enter


def _aentering(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], span_kind: SpanKind, remote: bool
) -> Callable[[], Awaitable[StepContext]]:
    """:func:`_entering` for an async stream (``astream``, and ``astream_events`` through it)."""
    parent = context.get_current()
    attributes = _conversation_attributes(args, kwargs)
    node = _node_name(args, kwargs)

    async def enter() -> StepContext:
        if context.get_current() is parent:
            return await _agraph_step_context(name, attributes, span_kind, remote, node)
        token = context.attach(parent)
        try:
            return await _agraph_step_context(name, attributes, span_kind, remote, node)
        finally:
            context.detach(token)

    return enter


def _node_name(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The node a graph runs as, in the graph that runs it (LangGraph's ``langgraph_node`` in the
    run's config), or ``None`` for a graph run by other code."""
    config = kwargs.get("config", args[1] if len(args) > 1 else None)
    metadata = config.get("metadata") if isinstance(config, Mapping) else None
    node = metadata.get("langgraph_node") if isinstance(metadata, Mapping) else None
    return node if isinstance(node, str) else None


def _conversation_attributes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    config = kwargs.get("config", args[1] if len(args) > 1 else None)
    thread_id = None
    if isinstance(config, Mapping):
        configurable = config.get("configurable")
        if isinstance(configurable, Mapping):
            thread_id = configurable.get("thread_id")
    return {GEN_AI_CONVERSATION_ID: str(thread_id)} if thread_id is not None else None


# -- graphs -------------------------------------------------------------------------------------


def _no_hop() -> StepContext:
    """The step context of a graph run that is no agent's: the consumer's context, no hop."""
    return context.get_current(), None


async def _ano_hop() -> StepContext:
    return context.get_current(), None


def _agent_name(instance: object) -> str | None:
    """The name a graph, remote graph or tool stands under in the chain (``None``: no name, no hop)."""
    name = getattr(instance, "name", None)
    return name if isinstance(name, str) and name else None


@unless_suppressed
def graph_invoke(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``Pregel.invoke``: the run is one ``invoke_agent`` hop around the call (the stream it runs
    is inside it: :func:`graph_stream` lets it through)."""
    name = _agent_name(instance)
    if name is None or name == DEFAULT_GRAPH_NAME:
        return wrapped(*args, **kwargs)  # its stream keeps the run's handoffs
    return invoke_in_hop(
        _entering(name, args, kwargs, SpanKind.INTERNAL, remote=False),
        instance,
        lambda: wrapped(*args, **kwargs),
    )


@unless_suppressed
def graph_ainvoke(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``Pregel.ainvoke``: as :func:`graph_invoke`."""
    name = _agent_name(instance)
    if name is None or name == DEFAULT_GRAPH_NAME:
        return wrapped(*args, **kwargs)
    return ainvoke_in_hop(
        _aentering(name, args, kwargs, SpanKind.INTERNAL, remote=False),
        instance,
        lambda: wrapped(*args, **kwargs),
    )


@unless_suppressed
def graph_stream(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``Pregel.stream``: the run is one ``invoke_agent`` hop, from first chunk to last."""
    name = _agent_name(instance)
    if name is None or name == DEFAULT_GRAPH_NAME:
        # No agent, no hop; its steps still keep the handoffs its nodes' tools make (._handoffs).
        return stream_in_hop(_no_hop, lambda: wrapped(*args, **kwargs))
    if invoked(instance):  # the stream of this graph's invoke, already in its hop
        return wrapped(*args, **kwargs)
    return stream_in_hop(
        _entering(name, args, kwargs, SpanKind.INTERNAL, remote=False),
        lambda: wrapped(*args, **kwargs),
    )


@unless_suppressed
def graph_astream(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``Pregel.astream``: as :func:`graph_stream`."""
    name = _agent_name(instance)
    if name is None or name == DEFAULT_GRAPH_NAME:
        return astream_in_hop(_ano_hop, lambda: wrapped(*args, **kwargs))
    if invoked(instance):
        return wrapped(*args, **kwargs)
    return astream_in_hop(
        _aentering(name, args, kwargs, SpanKind.INTERNAL, remote=False),
        lambda: wrapped(*args, **kwargs),
    )


# -- remote graphs ------------------------------------------------------------------------------


def _with_carrier(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the current context (chain in baggage, traceparent) added to ``headers``."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if "baggage" not in carrier and (token := baggage.get_baggage(CHAIN_BAGGAGE_KEY)) is not None:
        # Propagators configured without baggage would drop the chain, and with it every loop that
        # runs through a remote graph: send the chain member alone.
        carrier["baggage"] = f"{CHAIN_BAGGAGE_KEY}={quote(str(token))}"
    headers = dict(kwargs.get("headers") or {})
    for key, value in carrier.items():
        existing = next((k for k in headers if k.lower() == key), None)
        if existing is not None and key == "baggage" and headers[existing]:
            # The caller's own baggage members travel too (W3C baggage is a comma-separated list;
            # on a repeated key the last member wins, which is the chain of this hop).
            headers[existing] = f"{headers[existing]},{value}"
        else:
            if existing is not None:
                del headers[existing]
            headers[key] = value
    return {**kwargs, "headers": headers}


@unless_suppressed
def remote_stream(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``RemoteGraph.stream``: a client hop into the remote graph; the headers carry the chain."""
    name = _agent_name(instance)
    if name is None:
        return wrapped(*args, **kwargs)
    return stream_in_hop(
        _entering(name, args, kwargs, SpanKind.CLIENT, remote=True),
        lambda: wrapped(*args, **_with_carrier(kwargs)),
    )


@unless_suppressed
def remote_astream(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``RemoteGraph.astream``: as :func:`remote_stream`."""
    name = _agent_name(instance)
    if name is None:
        return wrapped(*args, **kwargs)
    return astream_in_hop(
        _aentering(name, args, kwargs, SpanKind.CLIENT, remote=True),
        lambda: wrapped(*args, **_with_carrier(kwargs)),
    )


# -- tools --------------------------------------------------------------------------------------


def refusal_output(err: DelegationRefused | TreeBudgetExceeded, tool: str, tool_call_id: str | None) -> Any:
    """What a refused tool call returns, as a tool that handled its own error would.

    For a model's tool call (it has an id) a ``ToolMessage`` with ``status="error"``; for a direct
    call without one, the text alone (``BaseTool`` returns a handled ``ToolException`` the same way).
    """
    text = refusal_text(err) if isinstance(err, DelegationRefused) else str(err)
    if tool_call_id is None:
        return text
    return ToolMessage(content=text, tool_call_id=tool_call_id, name=tool, status="error")


def _tool_hop(instance: BaseTool, kwargs: dict[str, Any]) -> tuple[Delegation, str | None]:
    tool_call_id = kwargs.get("tool_call_id")
    attributes = {GEN_AI_TOOL_CALL_ID: tool_call_id} if tool_call_id else None
    return delegate(instance.name, kind="tool", attributes=attributes), tool_call_id


def _tool_context(hop: Delegation, name: str) -> context.Context:
    """Decide a tool hop (raises when refused); the context its call begins in, span to follow."""
    ctx = _in_run(hop.decide)
    return _with_open_hop(ctx, "tool", name, hop.chain, wait("tool", hop))


async def _atool_context(hop: Delegation, name: str) -> context.Context:
    """:func:`_tool_context` in async code: decided with ``adecide``."""
    ctx = await _ain_run(hop.adecide)
    return _with_open_hop(ctx, "tool", name, hop.chain, wait("tool", hop))


@unless_suppressed
def tool_run(wrapped: Wrapped, instance: BaseTool, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``BaseTool.run``: one ``execute_tool`` hop; a refusal is returned, not raised."""
    if _agent_name(instance) is None:
        return wrapped(*args, **kwargs)
    hop, tool_call_id = _tool_hop(instance, kwargs)
    arrival = context.get_current()  # the calling agent's: where a handoff it makes is decided
    # As call_in_hop, without its closures (a tool call is the hop a graph makes most).
    try:
        token = context.attach(_tool_context(hop, instance.name))
    except DelegationRefused as err:  # refused on entry
        return refusal_output(err, instance.name, tool_call_id)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        context.detach(token)
        finish(hop, exc)
        if isinstance(exc, DelegationRefused | TreeBudgetExceeded):  # a refusal inside the tool
            return refusal_output(exc, instance.name, tool_call_id)
        raise
    context.detach(token)
    finish(hop)
    if isinstance(result, Command):  # a handoff tool's command: a transfer, decided now
        try:
            hand_over(result, arrival)
        except DelegationRefused as err:
            return refusal_output(err, instance.name, tool_call_id)
    return result


@unless_suppressed
def tool_arun(wrapped: Wrapped, instance: BaseTool, args: tuple[Any, ...], kwargs: Any) -> Awaitable[Any]:
    """``BaseTool.arun``: as :func:`tool_run`."""
    if _agent_name(instance) is None:
        return wrapped(*args, **kwargs)  # type: ignore[no-any-return]

    async def run() -> Any:
        hop, tool_call_id = _tool_hop(instance, kwargs)
        arrival = context.get_current()
        try:
            ctx = await _atool_context(hop, instance.name)  # a budget store is awaited
            result = await acall_in_hop(hop, lambda: wrapped(*args, **kwargs), enter=lambda: ctx)
            if isinstance(result, Command):
                await ahand_over(result, arrival)
            return result
        except (DelegationRefused, TreeBudgetExceeded) as err:
            return refusal_output(err, instance.name, tool_call_id)
        finally:
            WAITING.discard(hop)  # acall_in_hop has finished it

    return run()
