"""Agent-like OTLP traffic for the processor benchmark, and the two servers it runs against.

Traffic (``MIXES``):

- ``guarded``: traces as an agent system under the inline guard exports them -- a planner that
  calls a model and a search tool, then a budget agent over A2A (HTTP client and server spans),
  which calls a model and a lookup tool that queries a database. Guard spans carry the inline
  guard's attributes (docs/spec.md §5); model, HTTP and database spans carry their
  semantic-convention attributes. 13 spans a trace, 4 of them calls; spans are ordered as a
  BatchSpanProcessor exports them (children end first). Complete traces, parents in the same
  request, one scope, no links: the detector's best case.
- ``budget``: the same traces with the guard's tree budget on (as it is by default): each guard
  span also carries ``otel_guard.budget.hops``, each trace a delegation tree of its own.
- ``dialects``: the same guarded traces among recorded third-party ones (OpenInference,
  OpenLLMetry, the openai-agents-v2 instrumentation, pydantic-ai), traces split so that parents
  arrive a request after their children, and trace roots that link to earlier traces
  (see :func:`mixed`).

Every cycle of requests gets new trace ids, so a processor cannot skip spans it has seen.

Servers (run as ``python bench/_processor_traffic.py sink|passthrough ...``):
- sink: an OTLP/gRPC TraceService (on the engine's HTTP/2 server) that counts the spans it is sent
  and acknowledges them; the count is read with ``COUNT`` (a method of its own on the same port,
  answered with the count in ASCII), so that the benchmark can tell that every span it sent got
  through, whatever batched it on the way;
- passthrough: the baseline proxy: parses each request (to count its spans) and forwards the bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import grpc
import grpc.aio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from otel_guard_processor._engine import GrpcServer
from otel_guard_processor.engine import decode_counts

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
EXPORT = f"/{SERVICE}/Export"
COUNTER = "otel_guard.bench.Sink"
COUNT = f"/{COUNTER}/Count"
SPANS_PER_TRACE = 13


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, list):
        array = ArrayValue(values=[AnyValue(string_value=str(v)) for v in value])
        return KeyValue(key=key, value=AnyValue(array_value=array))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _guard(agents: list[str], operation: str, name_key: str, root: str, hops: int) -> list[KeyValue]:
    attributes = [
        _kv("gen_ai.operation.name", operation),
        _kv(name_key, agents[-1]),
        _kv("otel_guard.chain.agents", agents),
        _kv("otel_guard.chain.skills", [""] * len(agents)),
        _kv("otel_guard.chain.root", root),
        _kv("otel_guard.chain.depth", len(agents)),
        _kv("otel_guard.name_depth", 1),
        _kv("otel_guard.decision", "allow"),
        _kv("otel_guard.mode", "enforce"),
    ]
    if hops:
        # In the order the guard writes them: the root after the mode, the tree budget's count last.
        attributes.append(attributes.pop(4))
        attributes.append(_kv("otel_guard.budget.hops", hops))
    return attributes


def _chat() -> list[KeyValue]:
    return [
        _kv("gen_ai.operation.name", "chat"),
        _kv("gen_ai.provider.name", "openai"),
        _kv("gen_ai.request.model", "gpt-4o"),
        _kv("gen_ai.response.model", "gpt-4o-2024-08-06"),
        _kv("gen_ai.usage.input_tokens", 812),
        _kv("gen_ai.usage.output_tokens", 96),
    ]


def _http(server: bool) -> list[KeyValue]:
    attributes = [
        _kv("http.request.method", "POST"),
        _kv("http.response.status_code", 200),
        _kv("server.address", "budget.agents.internal"),
        _kv("server.port", 8080),
    ]
    attributes.append(
        _kv("http.route", "/a2a") if server else _kv("url.full", "http://budget.agents.internal:8080/a2a")
    )
    return attributes


def one_trace(trace_id: bytes, budget: bool = False) -> list[Span]:
    """One trace's spans, children before parents; with ``budget``, the guard's spans carry the
    tree budget's hop count (``otel_guard.budget.hops``, the guard's default), each trace a tree
    of its own."""
    spans: list[Span] = []
    time = [1_700_000_000_000_000_000]
    root = trace_id.hex() if budget else "9f" * 16
    hops = iter(range(1, 5)) if budget else iter(lambda: 0, 1)

    def guard(agents: list[str], operation: str, name_key: str) -> list[KeyValue]:
        return _guard(agents, operation, name_key, root, next(hops))

    def span(name: str, parent: Span | None, kind: int, attributes: list[KeyValue]) -> Span:
        time[0] += 1_000_000
        made = Span(
            trace_id=trace_id,
            span_id=os.urandom(8),
            parent_span_id=parent.span_id if parent else b"",
            name=name,
            kind=kind,
            start_time_unix_nano=time[0],
            end_time_unix_nano=time[0] + 50_000_000,
        )
        made.attributes.extend(attributes)
        spans.append(made)
        return made

    internal, server, client = Span.SPAN_KIND_INTERNAL, Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT
    planner = span(
        "invoke_agent planner", None, internal, guard(["planner"], "invoke_agent", "gen_ai.agent.name")
    )
    span("chat gpt-4o", planner, client, _chat())
    search = span(
        "execute_tool search",
        planner,
        internal,
        guard(["planner", "search"], "execute_tool", "gen_ai.tool.name"),
    )
    span("GET", search, client, _http(False))
    post = span("POST", planner, client, _http(False))
    route = span("POST /a2a", post, server, _http(True))
    budget = span(
        "invoke_agent budget",
        route,
        server,
        guard(["planner", "budget"], "invoke_agent", "gen_ai.agent.name"),
    )
    span("chat gpt-4o", budget, client, _chat())
    lookup = span(
        "execute_tool lookup",
        budget,
        internal,
        guard(["planner", "budget", "lookup"], "execute_tool", "gen_ai.tool.name"),
    )
    span(
        "SELECT budgets",
        lookup,
        client,
        [_kv("db.system.name", "postgresql"), _kv("db.operation.name", "SELECT")],
    )
    span("chat gpt-4o", budget, client, _chat())
    span("chat gpt-4o", planner, client, _chat())
    span("chat gpt-4o", planner, client, _chat())
    assert len(spans) == SPANS_PER_TRACE
    # Exported as they end: a span ends after its children, so parents come last.
    return list(reversed(spans))


class Template:
    """A cycle of requests that share trace ids; ``next()`` gives the next one with new ids.

    Every cycle gets new trace ids (the same in all its requests, so a trace split across two of
    them stays one trace, and a link still points at its span): a processor cannot skip spans it
    has seen.
    """

    def __init__(self, requests: list[ExportTraceServiceRequest]) -> None:
        self.raws = [message.SerializeToString() for message in requests]
        self.sizes = [
            sum(len(scope.spans) for resource in message.resource_spans for scope in resource.scope_spans)
            for message in requests
        ]
        self.raw = self.raws[0]
        self.spans = sum(self.sizes) // len(self.sizes)  # a request's spans, on average
        self.trace_ids = sorted(
            {
                span.trace_id
                for message in requests
                for resource in message.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            }
        )
        index_of = {trace_id: index for index, trace_id in enumerate(self.trace_ids)}
        # Where each trace id stands in the bytes (as a field: tag 0x0a, length 16; a link's trace
        # id too), so that a request with new ids is one join of the pieces between them -- cheap
        # enough that the load generator does not compete with the servers it measures.
        self._layouts: list[tuple[list[bytes], list[int], bytes]] = []
        for raw in self.raws:
            places: list[tuple[int, int]] = []
            for trace_id, index in index_of.items():
                field = b"\n\x10" + trace_id
                at = raw.find(field)
                while at >= 0:
                    places.append((at + 2, index))
                    at = raw.find(field, at + 1)
            places.sort()
            pieces: list[bytes] = []
            which: list[int] = []
            start = 0
            for at, index in places:
                pieces.append(raw[start:at])
                which.append(index)
                start = at + 16
            self._layouts.append((pieces, which, raw[start:]))
        self._turn = 0
        self._ids: list[bytes] = []

    def next(self) -> tuple[bytes, int]:
        """The next request of the cycle (new ids at the start of each cycle) and its span count."""
        turn = self._turn
        if turn == 0:
            self._ids = [os.urandom(16) for _ in self.trace_ids]
        self._turn = (turn + 1) % len(self.raws)
        pieces, which, tail = self._layouts[turn]
        ids = self._ids
        parts: list[bytes] = []
        for piece, index in zip(pieces, which, strict=True):
            parts.append(piece)
            parts.append(ids[index])
        parts.append(tail)
        return b"".join(parts), self.sizes[turn]


def _request(scopes: dict[str, list[Span]]) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    resource_spans = message.resource_spans.add()
    resource_spans.resource.attributes.extend(
        [_kv("service.name", "agents"), _kv("service.version", "1.4.2")]
    )
    for name, spans in scopes.items():
        scope = resource_spans.scope_spans.add()
        scope.scope.name = name
        scope.spans.extend(spans)
    return message


def guarded(traces: int) -> Template:
    """The guard's traffic: one request of ``traces`` guarded traces (13 spans each, all allowed)."""
    return Template(
        [_request({"otel_guard": [span for _ in range(traces) for span in one_trace(os.urandom(16))]})]
    )


def budgeted(traces: int) -> Template:
    """The guard's traffic with its tree budget on (its default): the guarded traces, each a tree
    of its own, every guard span with the tree's hop count (``otel_guard.budget.hops``)."""
    spans = [span for _ in range(traces) for span in one_trace(os.urandom(16), budget=True)]
    return Template([_request({"otel_guard": spans})])


# The recorded third-party traces of the processor's tests: healthy runs, as they were exported.
DIALECTS_TESTS = Path(__file__).resolve().parent.parent / "tests" / "processor" / "dialects"
DIALECT_TRACES = ("oai_oi", "oai_otelv2", "lg_oi", "lg_tl", "pai_oi_same")


def _recorded(name: str) -> dict[str, list[Span]]:
    """The spans of one recorded healthy run, by instrumentation scope, children first."""
    sys.path[:0] = [str(DIALECTS_TESTS), str(DIALECTS_TESTS.parent)]  # corpus_spans, processor_spans
    from corpus_spans import CORPUS, read_spans, to_span

    scopes: dict[str, list[Span]] = {}
    for record in sorted(read_spans(CORPUS / f"{name}.control.spans.jsonl"), key=lambda r: -r["start"]):
        scopes.setdefault(record["scope"], []).append(to_span(record))
    return scopes


def _with_trace_id(spans: list[Span], trace_id: bytes) -> list[Span]:
    copies = []
    for span in spans:
        copy = Span()
        copy.CopyFrom(span)
        copy.trace_id = trace_id
        copies.append(copy)
    return copies


def mixed(traces: int) -> Template:
    """Two requests in turn, ``traces`` traces each: what a pipeline sees from many instrumentations.

    Per request, a fifth of the traces each from the inline guard (the 13-span trace above) and
    from recordings of OpenInference (OpenAI Agents SDK, LangGraph), OpenLLMetry (LangGraph),
    opentelemetry-instrumentation-openai-agents-v2 and pydantic-ai with OpenInference's span
    processor (``tests/processor/dialects/corpus``, healthy runs). A quarter of the traces are
    split across the two requests, their children in the first and the rest (their parents) in
    the second; a tenth of the second request's traces start with a root span that links to a
    span of a trace in the first.
    """
    recorded = [_recorded(name) for name in DIALECT_TRACES]
    first: dict[str, list[Span]] = {}
    second: dict[str, list[Span]] = {}
    for index in range(traces):
        for request in (first, second):
            trace_id = os.urandom(16)
            kind = index % (len(recorded) + 1)
            scopes = (
                {"otel_guard": one_trace(trace_id)}
                if kind == 0
                else {scope: _with_trace_id(spans, trace_id) for scope, spans in recorded[kind - 1].items()}
            )
            split = request is first and index % 4 == 0
            for scope, spans in scopes.items():
                if split:  # children first, in this request; parents in the other
                    half = len(spans) // 2
                    first.setdefault(scope, []).extend(spans[:half])
                    second.setdefault(scope, []).extend(spans[half:])
                else:
                    request.setdefault(scope, []).extend(spans)
            if request is second and index % 10 == 0:
                # A trace handed over through a queue: its root links to a span of the first request.
                target = next(iter(first.values()))[index % 5]
                root = Span(
                    trace_id=os.urandom(16),
                    span_id=os.urandom(8),
                    name="process jobs",
                    kind=Span.SPAN_KIND_CONSUMER,
                    start_time_unix_nano=1_700_000_000_000_000_000,
                    end_time_unix_nano=1_700_000_000_100_000_000,
                )
                root.links.add(trace_id=target.trace_id, span_id=target.span_id)
                child = one_trace(root.trace_id)[-1]  # the guard's planner span, under the root
                child.parent_span_id = root.span_id
                second.setdefault("otel_guard", []).extend([child, root])
    return Template([_request(first), _request(second)])


MIXES = {"guarded": guarded, "dialects": mixed, "budget": budgeted}


# --- servers -----------------------------------------------------------------------------------


async def _serve(port: int, handler: object) -> None:
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.so_reuseport", 0)]
    )
    method = grpc.unary_unary_rpc_method_handler(handler)  # type: ignore[arg-type]
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": method}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def _spans_in(raw: bytes) -> int:
    """The spans in a request, counted by the engine's decoder (a fifth of a full protobuf parse's
    CPU, which the sink spent beside every arm on the same two cores)."""
    spans: int = decode_counts(raw, ())[0]
    return spans


async def sink(port: int) -> None:
    """Acknowledge every request and count its spans (a Collector in front re-batches them, so
    only a parse tells how many came).

    Served by the engine's HTTP/2 server (the processor's own receiver transport, off the
    interpreter lock), not by grpcio's: the sink shares the two cores with every arm, and a grpcio
    sink spent as much CPU a span as the processor itself, so that the processor's spans/s were
    the harness's. Each arm sends it the same way, over a gRPC channel.
    """
    server = GrpcServer(["127.0.0.1"], port, 64 * 1024 * 1024, [EXPORT, COUNT])
    spans = 0

    def take() -> None:
        nonlocal spans
        calls, _ = server.take()
        for _, method, raw, reply in calls:
            if method == 0:
                spans += _spans_in(raw)
                reply.ok(b"")
            else:
                reply.ok(str(spans).encode())

    server.start()
    asyncio.get_running_loop().add_reader(server.wake_fd(), take)
    print("ready", flush=True)
    await asyncio.Event().wait()  # until the benchmark stops the process


async def passthrough(port: int, forward: str) -> None:
    channel = grpc.aio.insecure_channel(forward, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)])
    call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    spans = [0]

    async def export(raw: bytes, context: object) -> bytes:
        request = ExportTraceServiceRequest.FromString(raw)
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                spans[0] += len(scope_spans.spans)
        response: bytes = await call(raw, timeout=10)
        return response

    await _serve(port, export)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["sink", "passthrough"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--forward")
    args = parser.parse_args()
    try:
        asyncio.run(sink(args.port) if args.role == "sink" else passthrough(args.port, args.forward))
    except KeyboardInterrupt:
        sys.exit(0)
