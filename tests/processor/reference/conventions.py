"""Span forests in the newest GenAI conventions' shapes, written from the conventions, not recorded.

open-telemetry/semantic-conventions-genai, read at these commits (no runtime here emits them yet):

- ``docs/gen-ai/gen-ai-agent-spans.md`` (e8fc575): ``invoke_agent {gen_ai.agent.name}``, INTERNAL
  for an agent in the process and CLIENT for a remote one; a workflow is an ``invoke_agent`` INTERNAL
  span of its own name (the ``invoke_workflow`` operation folded into it).
- the tool-based transfer refinement (PR #447, ``examples-agent-interactions.md``): the tool span
  of a transfer is ``execute_tool {gen_ai.tool.name} {gen_ai.transfer.target.name}`` with
  ``gen_ai.agent.name`` the source agent, ``gen_ai.transfer.mode`` (``return_to_caller`` or
  ``pass_control``) and ``gen_ai.transfer.target.type`` ``agent``; the target's ``invoke_agent``
  runs below it (``handoff``: passing control, the target beside the source, as a runtime may run
  it). The caller-aware refinement of the ``invoke_agent`` CLIENT span: ``gen_ai.caller.name`` and
  ``gen_ai.caller.type`` (``agent`` or ``workflow``).
- ``docs/gen-ai/a2a.md`` (6718089): client and server spans named ``{a2a.method.name}``
  (``SendMessage``; ``GetTask`` to poll), CLIENT / SERVER, with ``gen_ai.agent.name`` of the target's
  (client) or the local (server) Agent Card, below the framework's ``invoke_agent`` CLIENT span and
  above the HTTP client span; the server's below the HTTP server span.
- ``docs/gen-ai/mcp.md`` (0393513): ``{mcp.method.name} {target}`` (``tools/call get-weather``),
  CLIENT and SERVER, ``mcp.method.name``, ``gen_ai.tool.name``, ``jsonrpc.request.id`` and
  (recommended only) ``gen_ai.operation.name`` ``execute_tool``; the server span is a child of the
  client span (context through ``params._meta``).

Each forest is planner and budget asking each other: ``loop`` planner -> budget -> planner -> ...
(5 calls in all, one trace), ``healthy`` planner asks budget once. A forest is (scope, span) pairs
in start order, as :func:`reference.forests.requests` delivers them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from typing import Final

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from processor_spans import any_value

INTERNAL, SERVER, CLIENT = Span.SPAN_KIND_INTERNAL, Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT
FRAMEWORK: Final = "agent.framework"
A2A_SCOPE: Final = "a2a-python-sdk"
MCP_SCOPE: Final = "mcp"
HTTP_SCOPE: Final = "opentelemetry.instrumentation.httpx"
ASGI_SCOPE: Final = "opentelemetry.instrumentation.asgi"
CALLS: Final = 5  # the loop's calls: planner -> budget three times, budget -> planner twice
OTHER = {"planner": "budget", "budget": "planner"}

Forest = list[tuple[str, Span]]


class Builder:
    """The spans of one trace, each started after the one before."""

    def __init__(self) -> None:
        self.trace_id = os.urandom(16)
        self.forest: Forest = []
        self._clock = itertools.count(1_700_000_000_000_000_000, 1_000_000)

    def span(
        self,
        name: str,
        parent: Span | None,
        attributes: Mapping[str, str],
        *,
        kind: int = INTERNAL,
        scope: str = FRAMEWORK,
    ) -> Span:
        span = Span(
            trace_id=self.trace_id,
            span_id=os.urandom(8),
            parent_span_id=parent.span_id if parent is not None else b"",
            name=name,
            kind=kind,
            start_time_unix_nano=next(self._clock),
        )
        span.end_time_unix_nano = span.start_time_unix_nano + 1
        for key, value in attributes.items():
            span.attributes.add(key=key, value=any_value(value))
        self.forest.append((scope, span))
        return span

    def agent(self, name: str, parent: Span | None, *, kind: int = INTERNAL, **extra: str) -> Span:
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name, **extra}
        return self.span(f"invoke_agent {name}", parent, attributes, kind=kind)

    def tool(self, name: str, parent: Span, **extra: str) -> Span:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, **extra}
        return self.span(f"execute_tool {name}", parent, attributes)

    def http(self, parent: Span, route: str) -> Span:
        """An HTTP client span and the server span below it; returns the server span."""
        client = self.span("POST", parent, {"http.request.method": "POST"}, kind=CLIENT, scope=HTTP_SCOPE)
        return self.span(f"POST {route}", client, {"http.route": route}, kind=SERVER, scope=ASGI_SCOPE)


def calls_of(loop: bool) -> int:
    return CALLS if loop else 1


def workflow(loop: bool) -> Forest:
    """A workflow as an ``invoke_agent`` INTERNAL span of its own name, running planner, whose
    tool runs budget, whose tool runs planner, ...; the healthy workflow runs budget after."""
    spans = Builder()
    root = spans.agent("offsite_workflow", None)
    agent, name = spans.agent("planner", root), "planner"
    for _ in range(calls_of(loop)):
        target = OTHER[name]
        agent, name = spans.agent(target, spans.tool(f"ask_{target}", agent)), target
    if not loop:
        spans.agent("budget", root)
    return spans.forest


def transfer(loop: bool) -> Forest:
    """Tool-based transfers that return to the caller: the target runs below the transfer's tool."""
    spans = Builder()
    agent, name = spans.agent("planner", None), "planner"
    for _ in range(calls_of(loop)):
        target = OTHER[name]
        tool = spans.span(
            f"execute_tool transfer_to_{target} {target}",
            agent,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": f"transfer_to_{target}",
                "gen_ai.agent.name": name,
                "gen_ai.transfer.mode": "return_to_caller",
                "gen_ai.transfer.target.name": target,
                "gen_ai.transfer.target.type": "agent",
            },
        )
        agent, name = spans.agent(target, tool), target
    return spans.forest


def handoff(loop: bool) -> Forest:
    """Transfers that pass control, each target's ``invoke_agent`` beside its source's under the
    workflow (as the OpenAI Agents SDK runs handoffs), not below the transfer's tool span."""
    spans = Builder()
    root = spans.agent("offsite_workflow", None)
    name = "planner"
    for _ in range(calls_of(loop)):
        target = OTHER[name]
        spans.span(
            f"execute_tool transfer_to_{target} {target}",
            spans.agent(name, root),
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": f"transfer_to_{target}",
                "gen_ai.agent.name": name,
                "gen_ai.transfer.mode": "pass_control",
                "gen_ai.transfer.target.name": target,
                "gen_ai.transfer.target.type": "agent",
            },
        )
        name = target
    spans.agent(name, root)
    return spans.forest


def a2a(loop: bool, framework: bool = True) -> Forest:
    """Agents in two processes over A2A: the caller's ``invoke_agent X`` CLIENT span (when the
    framework records one), the A2A client ``SendMessage`` and HTTP client spans; the HTTP server
    span, the A2A server ``SendMessage`` and (framework) the callee's ``invoke_agent X`` INTERNAL.
    The healthy caller polls its task twice (``GetTask``, siblings of ``SendMessage``)."""
    spans = Builder()
    agent, name = spans.agent("planner", None), "planner"
    for _ in range(calls_of(loop)):
        target = OTHER[name]
        above = spans.agent(target, agent, kind=CLIENT) if framework else agent
        card = {"a2a.method.name": "SendMessage", "gen_ai.agent.name": target}
        client = spans.span("SendMessage", above, card, kind=CLIENT, scope=A2A_SCOPE)
        server = spans.span("SendMessage", spans.http(client, "/"), card, kind=SERVER, scope=A2A_SCOPE)
        agent = spans.agent(target, server) if framework else server
        name = target
        if not loop:
            for _ in range(2):
                poll = {"a2a.method.name": "GetTask", "gen_ai.agent.name": target, "a2a.task.id": "t1"}
                spans.span("GetTask", above, poll, kind=CLIENT, scope=A2A_SCOPE)
    return spans.forest


def mcp(loop: bool, operation: bool = True) -> Forest:
    """Agents as MCP tools: ``tools/call ask_X`` CLIENT in the caller, the server's ``tools/call
    ask_X`` SERVER span its child, the agent X the server runs below that. ``operation``: the spans
    carry the recommended ``gen_ai.operation.name`` ``execute_tool`` (else ``mcp.method.name`` alone)."""
    spans = Builder()
    agent, name = spans.agent("planner", None), "planner"
    for number in range(calls_of(loop)):
        target = OTHER[name]
        attributes = {
            "mcp.method.name": "tools/call",
            "gen_ai.tool.name": f"ask_{target}",
            "jsonrpc.request.id": str(number + 1),
        }
        if operation:
            attributes["gen_ai.operation.name"] = "execute_tool"
        client = spans.span(f"tools/call ask_{target}", agent, attributes, kind=CLIENT, scope=MCP_SCOPE)
        server = spans.span(f"tools/call ask_{target}", client, attributes, kind=SERVER, scope=MCP_SCOPE)
        agent, name = spans.agent(target, server), target
    return spans.forest


def caller_named(loop: bool) -> Forest:
    """Remote calls whose caller's process records nothing but the ``invoke_agent`` CLIENT span,
    naming its caller (``gen_ai.caller.name``): the first one starts the trace."""
    spans = Builder()
    above: Span | None = None
    name = "planner"
    for _ in range(calls_of(loop)):
        target = OTHER[name]
        client = spans.agent(
            target, above, kind=CLIENT, **{"gen_ai.caller.name": name, "gen_ai.caller.type": "agent"}
        )
        above, name = spans.agent(target, spans.http(client, "/")), target
    return spans.forest


FORESTS: Final[dict[str, Callable[[bool], Forest]]] = {
    "workflow": workflow,
    "transfer": transfer,
    "handoff": handoff,
    "a2a": a2a,
    "a2a_alone": lambda loop: a2a(loop, framework=False),
    "mcp": mcp,
    "mcp_method_alone": lambda loop: mcp(loop, operation=False),
    "caller_named": caller_named,
}
