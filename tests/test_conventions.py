"""The guard's hop spans follow the GenAI semantic conventions (tests/semconv/genai-v0.1.yaml).

In-process agent and tool hops, a refused hop and the ASGI middleware's received hop, each checked
by tests/conventions.py; the A2A and MCP hops are checked in their own suites
(tests/instrumentation/a2a, tests/instrumentation/mcp), where their servers run. The checker is
itself checked: it rejects a span that breaks each rule it reads.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

import otel_guard
from otel_guard.asgi import GuardMiddleware
from otel_guard.guard import delegate
from tests.conventions import MODEL, WAIVED, assert_follows, model, problems
from tests.hop_spans import guard_spans


def test_the_model_names_its_source_and_the_kinds_the_hops_take() -> None:
    header = MODEL.read_text(encoding="utf-8").split("file_format:", 1)[0]
    assert "https://github.com/open-telemetry/semantic-conventions-genai" in header
    assert "model/gen-ai/spans.yaml   7e7e4e763354b505b8e1f76512f17a1977b00f70" in header
    spans = model().spans
    assert spans["gen_ai.invoke_agent.internal"].kind is SpanKind.INTERNAL
    assert spans["gen_ai.invoke_agent.client"].kind is SpanKind.CLIENT
    assert spans["gen_ai.execute_tool.internal"].kind is SpanKind.INTERNAL
    assert spans["a2a.client"].levels["a2a.method.name"] == "required"
    assert spans["mcp.server"].levels["jsonrpc.request.id"] == "conditionally_required"
    assert set(WAIVED) == {"gen_ai.provider.name"}  # docs/spec.md §5 says why


def test_agent_and_tool_hops_in_the_process(spans: Any) -> None:
    @otel_guard.agentic
    def planner() -> None:
        with delegate("lookup", kind="tool"):
            pass

    planner()

    agent, tool = guard_spans(spans)
    assert (agent.name, agent.kind, tool.name, tool.kind) == (
        "invoke_agent planner",
        SpanKind.INTERNAL,
        "execute_tool lookup",
        SpanKind.INTERNAL,
    )
    assert_follows(agent, available={"gen_ai.agent.name"})
    assert_follows(tool)


def test_a_refused_hop_records_its_error_type(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")

    @otel_guard.agentic
    def planner() -> None:
        planner()

    with pytest.raises(otel_guard.DelegationRefused):
        planner()

    refused = [s for s in guard_spans(spans) if dict(s.attributes or {})["otel_guard.decision"] == "refuse"]
    (span,) = refused
    assert dict(span.attributes or {})["error.type"] == "DelegationRefused"
    assert_follows(span, available={"error.type"})


async def test_the_asgi_middlewares_received_hop(spans: Any) -> None:
    """A request into GuardMiddleware: the agent runs here, so its hop is INTERNAL, a child of the
    caller's span (no HTTP instrumentation here: with one, of its SERVER span)."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    headers: dict[str, str] = {}
    with (
        delegate("planner", span_kind=SpanKind.CLIENT),
        delegate("budget", span_kind=SpanKind.CLIENT) as caller,
    ):
        propagate.inject(headers)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/price",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    await GuardMiddleware(app, agent="budget", skill="price")(scope, receive, send)

    assert seen == ["/price"]
    received = [s for s in spans.named("invoke_agent budget") if s.kind is SpanKind.INTERNAL]
    (hop,) = received
    assert hop.parent is not None
    assert hop.parent.is_remote
    assert hop.parent.span_id == caller.span.get_span_context().span_id
    assert_follows(hop, available={"gen_ai.agent.name"})
    for span in guard_spans(spans):
        assert_follows(span)


def _span(name: str, kind: SpanKind, **attributes: Any) -> ReadableSpan:
    context = trace.SpanContext(1, 2, False)
    return ReadableSpan(name, context, kind=kind, attributes=attributes)


AGENT = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "budget"}


@pytest.mark.parametrize(
    ("span", "protocol", "available", "complaint"),
    [
        (_span("invoke_agent budget", SpanKind.SERVER, **AGENT), None, (), "kind SERVER"),
        (_span("SendMessage", SpanKind.CLIENT, **AGENT), None, (), "name 'SendMessage'"),
        (
            _span("invoke_agent budget", SpanKind.INTERNAL, **AGENT, **{"gen_ai.agent.nmae": "x"}),
            None,
            (),
            "nmae",
        ),
        (
            _span("invoke_agent budget", SpanKind.INTERNAL, **AGENT, **{"server.port": "80"}),
            None,
            (),
            "server.port",
        ),
        (
            _span("invoke_agent budget", SpanKind.CLIENT, **AGENT),
            "a2a.client",
            (),
            "a2a.method.name is required",
        ),
        (
            _span("invoke_agent budget", SpanKind.CLIENT, **AGENT, **{"a2a.method.name": "message/send"}),
            "a2a.client",
            (),
            "'message/send' is not one of",
        ),
        (
            _span("invoke_agent budget", SpanKind.CLIENT, **AGENT, **{"a2a.method.name": "SendMessage"}),
            "a2a.client",
            {"gen_ai.conversation.id"},
            "gen_ai.conversation.id was available",
        ),
        (
            _span("execute_tool lookup", SpanKind.INTERNAL, **{"gen_ai.operation.name": "execute_tool"}),
            None,
            (),
            "gen_ai.tool.name is required",
        ),
    ],
)
def test_the_checker_rejects_what_breaks_the_conventions(
    span: ReadableSpan, protocol: str | None, available: set[str], complaint: str
) -> None:
    found = problems(span, protocol, available)
    assert any(complaint in problem for problem in found), found
