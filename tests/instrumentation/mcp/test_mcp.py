"""MCP in-process: the planner -> budget -> planner loop through real MCP clients and servers.

The server is the real ``MCPServer`` (or the low-level ``Server``) and the client the real
``mcp.Client``, connected in-process both ways the SDK offers: ``mode="auto"`` dispatches directly
(no JSON-RPC, no transport) and ``mode="legacy"`` runs JSON-RPC over memory streams.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import anyio
import mcp_types
import pytest
from instrumentors import instrumentor_fixture
from mcp import Client
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared import _otel as mcp_shared_otel
from mcp_app import ROUNDS, answer_text, build_server  # this folder is on sys.path
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import default_getter, default_setter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import otel_guard
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.mcp import EXTRACTION, PATCH_TARGETS, MCPInstrumentor
from otel_guard.instrumentation.mcp._refusal import REFUSAL_META_KEY
from tests.conventions import assert_follows
from tests.hop_spans import chain_of

MODES = ["auto", "legacy"]
# The spans of one hop in each in-process pairing: "auto" dispatches directly, the server running in
# the caller's own context, so the caller's hop is handed over and the call is one client span;
# "legacy" runs the server in its own task, which reads _meta and checks the hop again (server).
SIDES = {"auto": ["client"], "legacy": ["server", "client"]}


instrumented = instrumentor_fixture(MCPInstrumentor)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def hop_spans(spans: Any) -> list[ReadableSpan]:
    """Our hop spans (MCP's own spans are named after the method, e.g. ``tools/call planner``)."""
    return [s for s in spans.all() if s.name.startswith(("execute_tool ", "invoke_agent "))]


def side(span: ReadableSpan) -> str:
    """Which side of an MCP call a hop span is: both are INTERNAL ``execute_tool`` spans (the SDK's
    own spans are the CLIENT and SERVER ones); the server's carries the request's
    ``jsonrpc.request.id``, the client's only ``mcp.method.name``; "own" is a hop of the test's."""
    assert span.kind is SpanKind.INTERNAL, span.kind
    attrs = attributes(span)
    return "server" if "jsonrpc.request.id" in attrs else "client" if "mcp.method.name" in attrs else "own"


def decisions(spans: Any, name: str) -> list[tuple[str, str, tuple[str, ...]]]:
    return [
        (side(s), attributes(s)["otel_guard.decision"], chain_of(s, spans)[0])  # a lean hop: its parent's
        for s in spans.named(name)
    ]


async def call(
    server: MCPServer | LowLevelServer[Any], mode: str, tool: str, **arguments: Any
) -> mcp_types.CallToolResult:
    async with Client(server, mode=mode) as client:
        return await client.call_tool(tool, arguments)


# -- the loop -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_loop_is_refused_at_the_first_bounce(
    instrumented: MCPInstrumentor, spans: Any, mode: str
) -> None:
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []

    result = await call(build_server(ran, mode=mode), mode, "planner", rounds=ROUNDS)

    # The outer call completes with an answer; budget's call back into planner never ran.
    assert ran == ["planner", "budget"]
    assert not result.is_error
    text = answer_text(result)
    assert text.startswith("plan, with budget saying: budget, after planner said: [tool error] ")
    assert "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)" in text
    assert "agent planner is already in chain planner → budget" in text
    assert "do not call it again" in text
    # The refused hop: a CLIENT span in budget's body, refused before anything was sent.
    assert decisions(spans, "execute_tool planner") == [
        ("client", "refuse", ("planner", "budget", "planner")),
        *((where, "allow", ("planner",)) for where in SIDES[mode]),
    ]
    refused = spans.named("execute_tool planner")[0]
    assert attributes(refused)["otel_guard.reason"] == "cycle"
    assert [e.name for e in refused.events] == ["otel_guard.refused"]
    assert dict(refused.events[0].attributes or {})["otel_guard.reason"] == "cycle"
    assert decisions(spans, "execute_tool budget") == [
        (where, "allow", ("planner", "budget")) for where in SIDES[mode]
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_hop_spans_follow_the_conventions(instrumented: MCPInstrumentor, spans: Any, mode: str) -> None:
    """Every hop of the loop, allowed or refused, client or server side, is a GenAI execute_tool span
    with the MCP attributes (tests/conventions.py); the SDK's own spans of each call, with the
    JSON-RPC request id, are the CLIENT and SERVER ones around it."""
    otel_guard.configure(cycle_rule="agent")
    await call(build_server(mode=mode), mode, "planner", rounds=ROUNDS)

    ours = hop_spans(spans)
    assert {side(s) for s in ours} == set(SIDES[mode])
    for span in ours:
        where = side(span)
        available = {"gen_ai.tool.name"} | ({"jsonrpc.request.id"} if where == "server" else set())
        if attributes(span)["otel_guard.decision"] == "refuse":
            available.add("error.type")
        assert_follows(span, f"mcp.{where}", available)
        assert attributes(span)["mcp.method.name"] == "tools/call"
    by_id = {s.context.span_id: s for s in spans.all()}
    for client_hop in (
        s for s in ours if side(s) == "client" and attributes(s)["otel_guard.decision"] == "allow"
    ):
        # The SDK's span of the request, with its id: its client span, or through a direct
        # dispatcher (one process, "auto") the server's, both children of the hop.
        tool = attributes(client_hop)["gen_ai.tool.name"]
        (sent,) = [
            s
            for s in spans.all()
            if s.parent is not None
            and s.parent.span_id == client_hop.context.span_id
            and (s.name, s.kind)
            in {(f"MCP send tools/call {tool}", SpanKind.CLIENT), (f"tools/call {tool}", SpanKind.SERVER)}
        ]
        assert isinstance(attributes(sent)["jsonrpc.request.id"], str)
    for server_hop in (s for s in ours if side(s) == "server"):
        assert server_hop.parent is not None
        served = by_id[server_hop.parent.span_id]
        assert (served.name, served.kind) == (
            f"tools/call {attributes(server_hop)['gen_ai.tool.name']}",
            SpanKind.SERVER,
        )
        assert attributes(served)["jsonrpc.request.id"] == attributes(server_hop)["jsonrpc.request.id"]


@pytest.mark.parametrize("mode", MODES)
async def test_observe_mode_lets_the_loop_run_and_records_would_refuse(
    instrumented: MCPInstrumentor, spans: Any, mode: str
) -> None:
    otel_guard.configure(cycle_rule="agent", mode="observe")
    ran: list[str] = []

    result = await call(build_server(ran, mode=mode), mode, "planner", rounds=3)

    assert ran == ["planner", "budget", "planner", "budget"]
    assert not result.is_error
    assert "[tool error]" not in answer_text(result)
    assert answer_text(result).endswith("budget: out of rounds")
    would = [s for s in hop_spans(spans) if attributes(s)["otel_guard.decision"] == "would_refuse"]
    # planner's second entry and budget's second entry, each on the client and, where the server
    # runs in a context of its own, again on the server.
    assert sorted((s.name, side(s), attributes(s)["otel_guard.chain.depth"]) for s in would) == sorted(
        (name, where, depth)
        for name, depth in (("execute_tool budget", 4), ("execute_tool planner", 3))
        for where in SIDES[mode]
    )
    for span in would:
        assert attributes(span)["otel_guard.reason"] == "cycle"
        assert attributes(span)["otel_guard.mode"] == "observe"
        assert [e.name for e in span.events] == ["otel_guard.would_refuse"]


async def test_decisions_are_counted(instrumented: MCPInstrumentor, metric_reader: Any) -> None:
    otel_guard.configure(cycle_rule="agent")

    def refused_planner_calls() -> int:
        return sum(
            int(point.value)
            for attrs, point in metric_reader.points("otel_guard.decisions")
            if attrs.get("gen_ai.tool.name") == "planner" and attrs.get("otel_guard.decision") == "refuse"
        )

    before = refused_planner_calls()
    await call(build_server(), "auto", "planner", rounds=ROUNDS)
    assert refused_planner_calls() == before + 1


# -- spans --------------------------------------------------------------------------------------


async def test_spans_carry_the_contract_attributes_and_nest(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    result = await call(build_server(), "legacy", "planner", rounds=0)
    assert answer_text(result) == "planner: out of rounds"

    client_span, server_span = sorted(spans.named("execute_tool planner"), key=side)
    assert (side(client_span), side(server_span)) == ("client", "server")
    for span in (client_span, server_span):
        attrs = attributes(span)
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.name"] == "planner"
        assert tuple(attrs["otel_guard.chain.agents"]) == ("planner",)
        assert tuple(attrs["otel_guard.chain.skills"]) == ("",)
        assert re.fullmatch("[0-9a-f]{32}", attrs["otel_guard.chain.root"])
        assert attrs["otel_guard.chain.depth"] == 1
        assert attrs["otel_guard.name_depth"] == 1
        assert attrs["otel_guard.decision"] == "allow"
        assert attrs["otel_guard.mode"] == "enforce"
        assert "otel_guard.reason" not in attrs
        assert not any("otel_guard.chain=" in str(value) for value in attrs.values())
    # One chain: the server checked the client's hop again, it did not start its own.
    assert (
        attributes(client_span)["otel_guard.chain.root"] == attributes(server_span)["otel_guard.chain.root"]
    )
    # Nesting: client hop -> MCP's send span -> MCP's server span -> server hop, one trace.
    by_id = {s.context.span_id: s for s in spans.all()}
    ancestors = []
    parent = server_span.parent
    while parent is not None:
        ancestors.append(by_id[parent.span_id].name)
        parent = by_id[parent.span_id].parent
    assert ancestors == ["tools/call planner", "MCP send tools/call planner", "execute_tool planner"]


# -- the carrier --------------------------------------------------------------------------------


def meta_echo_server() -> MCPServer:
    server = MCPServer("echo")

    @server.tool()
    async def show_meta(ctx: Context) -> dict[str, Any]:
        """Return the request's _meta."""
        return dict(ctx.request_context.meta or {})

    return server


async def test_meta_carries_traceparent_and_chain_over_memory_streams(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    async with Client(meta_echo_server(), mode="legacy") as client:
        result = await client.call_tool("show_meta", {}, meta={"app/key": "kept"})
    meta = result.structured_content
    assert isinstance(meta, dict)
    assert meta["app/key"] == "kept"
    client_span = next(s for s in spans.named("execute_tool show_meta") if side(s) == "client")
    match = re.fullmatch("00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}", meta["traceparent"])
    assert match is not None
    assert int(match[1], 16) == client_span.context.trace_id
    # The parent the server sees is the client hop, or MCP's send span inside it (JSON-RPC only).
    inside_client_hop = {client_span.context.span_id} | {
        s.context.span_id for s in spans.all() if s.parent and s.parent.span_id == client_span.context.span_id
    }
    assert int(match[2], 16) in inside_client_hop
    assert re.search(r"(^|,)otel_guard\.chain=[^,]+", meta["baggage"])


class CountingPropagator(CompositePropagator):
    """The default propagators (W3C trace context and baggage), counting what they inject and extract."""

    def __init__(self) -> None:
        super().__init__([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        self.injected = 0
        self.extracted = 0

    def inject(self, carrier: Any, context: Any = None, setter: Any = default_setter) -> None:
        self.injected += 1
        super().inject(carrier, context, setter)

    def extract(self, carrier: Any, context: Any = None, getter: Any = default_getter) -> Any:
        self.extracted += 1
        return super().extract(carrier, context, getter)


async def test_over_json_rpc_the_context_is_written_once_and_read_once(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    """MCP's JSON-RPC dispatcher writes the current context into ``_meta`` and MCP's server span reads
    it back: the guard adds neither a second injection nor a second extraction (each costs about what
    a span does with a chain token in the baggage), and the server hop still checks the chain sent."""
    configured = propagate.get_global_textmap()
    counting = CountingPropagator()
    async with Client(meta_echo_server(), mode="legacy") as client:
        await client.list_tools()  # else the call lists them first (for output schemas): a request more
        propagate.set_global_textmap(counting)
        try:
            with otel_guard.delegate("planner"):
                meta = (await client.call_tool("show_meta", {})).structured_content
        finally:
            propagate.set_global_textmap(configured)
    assert (counting.injected, counting.extracted) == (1, 1)
    assert isinstance(meta, dict)
    assert re.search(r"(^|,)otel_guard\.chain=[^,]+", meta["baggage"])
    server_hop = next(s for s in spans.named("execute_tool show_meta") if side(s) == "server")
    assert attributes(server_hop)["otel_guard.chain.agents"] == ("planner", "show_meta")
    assert attributes(server_hop)["otel_guard.decision"] == "allow"


def chain_echo_server() -> MCPServer:
    server = MCPServer("echo")

    @server.tool()
    async def show_chain(ctx: Context) -> dict[str, Any]:
        """Return the request's _meta and the chain in force in the tool body."""
        chain = otel_guard.current_chain()
        span = trace.get_current_span().get_span_context()
        return {
            "meta": dict(ctx.request_context.meta or {}),
            "agents": list(chain.agents) if chain else None,
            "root": chain.root if chain else None,
            "span_id": span.span_id,
        }

    return server


async def test_a_direct_dispatch_hands_the_hop_over_instead_of_writing_it_into_meta(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    """Client(server) awaits the server in the caller's context: the body runs in the caller's hop,
    one span for the call, with no second decision and nothing of the guard's in _meta."""
    with otel_guard.delegate("planner") as outer:
        async with Client(chain_echo_server()) as client:
            result = await client.call_tool("show_chain", {}, meta={"app/key": "kept"})
    seen = result.structured_content
    assert isinstance(seen, dict)
    # The application's key is kept (MCP adds its own io.modelcontextprotocol/* keys); no carrier.
    assert seen["meta"]["app/key"] == "kept"
    assert not {"traceparent", "tracestate", "baggage"} & set(seen["meta"])
    assert seen["agents"] == ["planner", "show_chain"]
    assert outer.chain is not None
    assert seen["root"] == outer.chain.root
    (client_span,) = spans.named("execute_tool show_chain")
    assert side(client_span) == "client"
    # MCP's server span nests under the hop by the shared context; the body runs under MCP's span.
    (mcp_span,) = spans.named("tools/call show_chain")
    assert mcp_span.parent is not None
    assert mcp_span.parent.span_id == client_span.context.span_id
    assert seen["span_id"] == mcp_span.context.span_id


async def test_a_handover_is_taken_once_and_only_by_its_own_call(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    """The body's own calls are new calls: a nested call to another tool is a hop of its own, and
    a tool calling itself through the same direct client is a cycle."""
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []
    server = MCPServer("nested")
    client_box: dict[str, Client] = {}

    @server.tool()
    async def outer() -> str:
        ran.append("outer")
        nested = await client_box["client"].call_tool("inner", {})
        again = await client_box["client"].call_tool("outer", {})
        return f"{answer_text(nested)} | {answer_text(again)}"

    @server.tool()
    async def inner() -> str:
        ran.append("inner")
        chain = otel_guard.current_chain()
        return "inner in " + (chain.path() if chain else "no chain")

    async with Client(server) as client:
        client_box["client"] = client
        result = await client.call_tool("outer", {})

    assert ran == ["outer", "inner"]
    text = answer_text(result)
    assert text.startswith("inner in outer → inner | ")
    assert "agent outer is already in chain outer" in text
    assert decisions(spans, "execute_tool inner") == [("client", "allow", ("outer", "inner"))]
    assert sorted(decisions(spans, "execute_tool outer")) == sorted(
        [("client", "allow", ("outer",)), ("client", "refuse", ("outer", "outer"))]
    )


async def test_a_request_the_body_sends_itself_is_not_taken_over_again(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    """A handover is taken once: a ``tools/call`` the body sends without ``call_tool`` (no hop of
    the client's, no chain in ``_meta``) is checked by the server as any such request is, in a hop of
    its own, and does not run in the hop handed over for the body's own call."""
    ran: list[str] = []
    server = MCPServer("raw")
    client_box: dict[str, Client] = {}

    @server.tool()
    async def outer(again: bool = True) -> str:
        ran.append("outer")
        chain = otel_guard.current_chain()
        if again:
            await send_raw_call_tool(client_box["client"], "outer", {}, again=False)
        return chain.path() if chain else "no chain"

    with otel_guard.delegate("planner"):
        async with Client(server) as client:
            client_box["client"] = client
            result = await client.call_tool("outer", {})

    assert ran == ["outer", "outer"]
    assert answer_text(result) == "planner → outer"
    # The body's call from the client, handed over; the raw request, checked by the server afresh.
    assert sorted(decisions(spans, "execute_tool outer")) == [
        ("client", "allow", ("planner", "outer")),
        ("server", "allow", ("outer",)),
    ]


async def test_a_direct_client_reads_its_dispatcher_where_the_instrumentor_looks() -> None:
    """The handover hinges on ClientSession keeping its dispatcher as ``_dispatcher``; a version that
    moves it makes every call go through _meta again (correct, slower), and this test names it."""
    from otel_guard.instrumentation.mcp._in_process import dispatches_directly

    async with Client(meta_echo_server()) as direct, Client(meta_echo_server(), mode="legacy") as streams:
        assert dispatches_directly(direct.session)
        assert not dispatches_directly(streams.session)


async def test_the_chain_travels_without_a_baggage_propagator(instrumented: MCPInstrumentor) -> None:
    """``OTEL_PROPAGATORS=tracecontext`` leaves baggage out; the chain still reaches the server."""
    otel_guard.configure(cycle_rule="agent")
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(TraceContextTextMapPropagator())
    try:
        async with Client(meta_echo_server(), mode="legacy") as client:
            meta = (await client.call_tool("show_meta", {})).structured_content
        ran: list[str] = []
        result = await call(build_server(ran, mode="legacy"), "legacy", "planner", rounds=ROUNDS)
    finally:
        propagate.set_global_textmap(configured)
    assert isinstance(meta, dict)
    assert re.fullmatch(r"otel_guard\.chain=[^,]+", meta["baggage"])
    assert ran == ["planner", "budget"]
    assert "reason: cycle" in answer_text(result)


# -- the server checks what arrives -------------------------------------------------------------


def carried_meta(*path: str) -> dict[str, str]:
    """The ``_meta`` an instrumented client would send from inside the hops ``path``."""
    meta: dict[str, str] = {}

    def inject(depth: int = 0) -> None:
        if depth == len(path):
            propagate.inject(meta)
            return
        with otel_guard.delegate(path[depth], kind="tool"):
            inject(depth + 1)

    inject()
    return meta


async def send_raw_call_tool(client: Client, tool: str, meta: Mapping[str, Any], **arguments: Any) -> Any:
    """A ``tools/call`` sent without ``ClientSession.call_tool``, as a client without otel-guard sends it."""
    request = mcp_types.CallToolRequest(
        params=mcp_types.CallToolRequestParams(name=tool, arguments=arguments, _meta=dict(meta))
    )
    return await client.session.send_request(request, mcp_types.CallToolResult)


@pytest.mark.parametrize("mode", MODES)
async def test_server_refuses_an_arriving_cycle_before_the_tool_body(
    instrumented: MCPInstrumentor, spans: Any, mode: str
) -> None:
    otel_guard.configure(cycle_rule="agent")
    meta = carried_meta("planner", "budget")
    ran: list[str] = []
    spans.clear()

    async with Client(build_server(ran, mode=mode), mode=mode) as client:
        result = await send_raw_call_tool(client, "planner", meta, rounds=ROUNDS)

    assert ran == []
    assert result.is_error
    assert "Refused by otel-guard (a2a_delegation_cycle, reason: cycle)" in answer_text(result)
    assert result.meta[REFUSAL_META_KEY] == {
        "code": "a2a_delegation_cycle",
        "reason": "cycle",
        "status": 409,
        "retryable": False,
        "agent": "planner",
    }
    assert decisions(spans, "execute_tool planner") == [
        ("server", "refuse", ("planner", "budget", "planner"))
    ]


async def test_server_refuses_a_chain_signed_with_an_unknown_key(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    otel_guard.configure(keys={"old": b"o" * 32})
    meta = carried_meta("budget")
    otel_guard.configure(keys={"new": b"n" * 32})
    ran: list[str] = []

    async with Client(build_server(ran), mode="auto") as client:
        result = await send_raw_call_tool(client, "planner", meta, rounds=0)

    assert ran == []
    assert result.is_error
    assert "reason: bad_signature" in answer_text(result)
    assert result.meta[REFUSAL_META_KEY]["code"] == "a2a_delegation_invalid"


async def test_server_accepts_a_signed_chain_and_a_call_without_one(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    otel_guard.configure(keys={"k1": b"s" * 32}, cycle_rule="agent")
    meta = carried_meta("budget")
    ran: list[str] = []
    async with Client(build_server(ran), mode="auto") as client:
        signed = await send_raw_call_tool(client, "planner", meta, rounds=0)
        bare = await send_raw_call_tool(client, "planner", {}, rounds=0)
    assert not signed.is_error
    assert not bare.is_error
    assert ran == ["planner", "planner"]
    assert sorted(
        tuple(attributes(s)["otel_guard.chain.agents"]) for s in spans.named("execute_tool planner")
    ) == [
        ("budget", "planner"),
        ("planner",),
    ]


# -- one call is one hop ------------------------------------------------------------------------


async def test_a_framework_hop_around_the_call_is_joined_not_repeated(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    """An agent framework's ``execute_tool planner`` hop around an MCP call of planner is one hop."""
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []
    async with (
        Client(build_server(ran), mode="legacy") as client,
        otel_guard.delegate("planner", kind="tool") as framework_hop,
    ):
        result = await client.call_tool("planner", {"rounds": 0})
    assert not result.is_error
    assert ran == ["planner"]
    assert decisions(spans, "execute_tool planner") == [
        ("server", "allow", ("planner",)),
        ("own", "allow", ("planner",)),
    ]
    assert framework_hop.chain is not None
    server_span = spans.named("execute_tool planner")[0]
    assert attributes(server_span)["otel_guard.chain.root"] == framework_hop.chain.root


async def test_a_tool_calling_itself_is_a_cycle(instrumented: MCPInstrumentor, spans: Any) -> None:
    server = MCPServer("self")
    entries = 0

    @server.tool()
    async def recurse(ctx: Context) -> str:
        """Calls itself, with no stop."""
        nonlocal entries
        entries += 1
        if entries > 3:  # the bound of an unguarded run
            return "stopped by the test's bound"
        async with Client(server, mode="auto") as client:
            return answer_text(await client.call_tool("recurse", {}))

    result = await call(server, "auto", "recurse")
    assert entries == 1
    assert "Delegation cycle: agent recurse is already in chain recurse" in answer_text(result)


async def test_a_refusal_inside_a_tool_body_reaches_the_caller_with_its_text(
    instrumented: MCPInstrumentor, spans: Any
) -> None:
    """MCPServer would say only "Error executing tool outer"; the caller needs the refusal."""
    server = MCPServer("nested")
    inner_ran = False

    @server.tool()
    async def outer() -> str:
        """Runs an agentic step of its own name: a cycle, refused inside the body."""
        nonlocal inner_ran
        with otel_guard.delegate("outer"):
            inner_ran = True
        return "not reached"

    result = await call(server, "auto", "outer")
    assert not inner_ran
    assert result.is_error
    assert answer_text(result).startswith(
        "[tool error] Refused by otel-guard (a2a_delegation_cycle, reason: cycle): "
        "Delegation cycle: agent outer is already in chain outer."
    )
    assert "do not call it again" in answer_text(result)
    # Direct in-process use of MCPServer.call_tool keeps its contract: a ToolError, now with the text.
    with pytest.raises(ToolError, match=r"^Refused by otel-guard \(a2a_delegation_cycle"):
        async with otel_guard.delegate("outer", kind="tool"):
            await server.call_tool("outer", {})


async def test_parallel_calls_are_not_a_cycle(instrumented: MCPInstrumentor, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []
    results: list[mcp_types.CallToolResult] = []
    async with Client(build_server(ran), mode="legacy") as client:

        async def one() -> None:
            results.append(await client.call_tool("planner", {"rounds": 0}))

        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(one)
    assert [r.is_error for r in results] == [False, False, False]
    assert ran == ["planner"] * 3


# -- the low-level server -----------------------------------------------------------------------


def lowlevel_loop_server(ran: list[str]) -> LowLevelServer[Any]:
    """planner <-> budget on ``mcp.server.lowlevel.Server``, with its own handler and no MCPServer."""
    tools = [
        mcp_types.Tool(
            name=name, input_schema={"type": "object", "properties": {"rounds": {"type": "integer"}}}
        )
        for name in ("planner", "budget")
    ]

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        ran.append(params.name)
        rounds = int((params.arguments or {}).get("rounds", 0))
        text = f"{params.name}: out of rounds"
        if rounds > 0:
            peer = "budget" if params.name == "planner" else "planner"
            async with Client(server, mode="legacy") as client:
                text = f"{params.name} <- {answer_text(await client.call_tool(peer, {'rounds': rounds - 1}))}"
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)])

    server: LowLevelServer[Any] = LowLevelServer("lowlevel", on_list_tools=list_tools, on_call_tool=call_tool)
    return server


@pytest.mark.parametrize("mode", MODES)
async def test_lowlevel_server_loop_is_refused(instrumented: MCPInstrumentor, spans: Any, mode: str) -> None:
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []
    result = await call(lowlevel_loop_server(ran), mode, "planner", rounds=ROUNDS)
    assert ran == ["planner", "budget"]
    assert not result.is_error
    assert "planner <- budget <- [tool error] Refused by otel-guard" in answer_text(result)


async def test_lowlevel_server_refuses_before_the_handler(instrumented: MCPInstrumentor, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    meta = carried_meta("budget", "planner")
    ran: list[str] = []
    async with Client(lowlevel_loop_server(ran), mode="legacy") as client:
        result = await send_raw_call_tool(client, "budget", meta, rounds=1)
    assert ran == []
    assert result.is_error
    assert "agent budget is already in chain budget → planner" in answer_text(result)


@pytest.mark.parametrize("mode", MODES)
async def test_lowlevel_server_turns_a_refusal_in_the_handler_into_the_tool_error(
    instrumented: MCPInstrumentor, mode: str
) -> None:
    """Over streams the server's own hop answers it; handed over (direct), the guard's frame around
    a low-level handler does (``MCPServer``'s answers every failure itself)."""

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        with otel_guard.delegate(params.name):  # the handler re-enters its own name
            raise AssertionError("the refused step ran")

    server: LowLevelServer[Any] = LowLevelServer("lowlevel", on_call_tool=call_tool)
    result = await call(server, mode, "summarize")
    assert result.is_error
    assert "Delegation cycle: agent summarize is already in chain summarize" in answer_text(result)
    assert result.meta[REFUSAL_META_KEY]["reason"] == "cycle"


def test_the_guarded_handler_is_built_once_per_registered_handler(instrumented: MCPInstrumentor) -> None:
    """The runner looks ``tools/call`` up for every request: each lookup hands back the same guarded
    entry (for the same handler), and one registered anew is guarded anew."""

    async def handler(ctx: Any, params: Any) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(content=[])

    server: LowLevelServer[Any] = LowLevelServer("lowlevel", on_call_tool=handler)
    first = server.get_request_handler("tools/call")
    assert first is not None
    assert server.get_request_handler("tools/call") is first
    assert first.params_type is mcp_types.CallToolRequestParams

    async def replaced(ctx: Any, params: Any) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(content=[])

    server.add_request_handler("tools/call", mcp_types.CallToolRequestParams, replaced)
    second = server.get_request_handler("tools/call")
    assert second is not None
    assert second is not first
    assert second is server.get_request_handler("tools/call")
    assert second.handler is not replaced  # guarded, not the bare handler


# -- suppression and uninstrument ---------------------------------------------------------------


async def test_suppressed_instrumentation_makes_no_hop(instrumented: MCPInstrumentor, spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    ran: list[str] = []
    with suppress_instrumentation():
        result = await call(build_server(ran, mode="legacy"), "legacy", "planner", rounds=3)
    assert ran == ["planner", "budget", "planner", "budget"]
    assert "[tool error]" not in answer_text(result)
    assert hop_spans(spans) == []


async def test_uninstrument_restores_the_runtime(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    targets = (*PATCH_TARGETS, EXTRACTION)
    originals = [resolve(target) for target in targets]
    instrumentor = MCPInstrumentor()
    instrumentor.instrument()
    for target, original in zip(targets, originals, strict=True):
        assert resolve(target) is not original, target
        assert resolve(target).__wrapped__ is original, target  # its name, docs and signature kept
    instrumentor.uninstrument()

    for target, original in zip(targets, originals, strict=True):
        assert resolve(target) is original, target
    assert resolve(EXTRACTION) is mcp_shared_otel.extract_trace_context
    ran: list[str] = []
    result = await call(build_server(ran, mode="legacy"), "legacy", "planner", rounds=4)
    # Unguarded, the loop bounces until the test's own bound stops it.
    assert ran == ["planner", "budget", "planner", "budget", "planner"]
    assert answer_text(result).endswith("planner: out of rounds")
    assert hop_spans(spans) == []


def test_patch_targets_exist_and_dependency_matches_installed_mcp() -> None:
    for target in (*PATCH_TARGETS, EXTRACTION):
        assert callable(resolve(target)), target
    instrumentor = MCPInstrumentor()
    assert list(instrumentor.instrumentation_dependencies()) == ["mcp >= 2.3, < 3"]
    assert instrumentor._check_dependency_conflicts() is None
