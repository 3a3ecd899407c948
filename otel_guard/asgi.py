"""Guard any HTTP agent: an ASGI middleware that makes each request one hop into a named agent.

An agent that speaks plain HTTP (a FastAPI or Starlette service, a bare ASGI app) gets the same guard
as an A2A server with one line::

    from otel_guard.asgi import GuardMiddleware

    app = GuardMiddleware(app, agent="budget", skill="price")
    # or with Starlette / FastAPI:
    app.add_middleware(GuardMiddleware, agent="budget", skill=lambda scope: scope["path"].strip("/"))

For every HTTP request the middleware

1. continues the caller's context from the request headers (``traceparent`` and ``baggage``, read by
   the global OpenTelemetry propagator, and ``baggage`` even when ``OTEL_PROPAGATORS`` leaves it out;
   when an OpenTelemetry ASGI middleware outside this one has already done so, its server span stays
   the parent and only the chain is read; ``baggage`` headers over 8,192 bytes joined, the W3C
   limit, are dropped unread),
2. checks the hop into ``agent`` against the chain that arrived (the ``otel_guard.chain`` baggage
   member) with ``delegate(agent, skill, receiving=True, span_kind=SERVER)``: a chain whose last hop is
   already this agent (the caller's client instrumentation added it) is checked again, not extended,
3. runs the app inside that hop, so the app's own outgoing calls carry the extended chain (any
   OpenTelemetry propagator injects it), and ends the ``invoke_agent {agent}`` span when the app is done.

A refused hop never reaches the app. The caller gets ``409 Conflict`` and a JSON body::

    {"error": "a2a_delegation_cycle",
     "reason": "cycle",
     "message": "Delegation cycle: agent planner is already in chain planner → budget"}

``error`` is the contract's code (``a2a_delegation_cycle``, ``a2a_delegation_depth`` or
``a2a_delegation_invalid``); 409 means the same call will be refused again, so the caller should
answer with what it has instead of retrying. In observe mode the request goes through and the span
records ``would_refuse``; a chain that fails verification is refused in observe mode too.

``skill`` is a string, ``None``, or a callable that gets the ASGI scope and returns the skill (or
``None``). WebSocket and lifespan scopes pass through untouched. The policy is the process-wide one
(``OTEL_GUARD_*`` or :func:`otel_guard.configure`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from contextvars import Token
from typing import Any, Final

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.trace import SpanKind

from otel_guard._start import settings_at_start
from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
SkillOf = Callable[[Scope], str | None]

__all__ = ["GuardMiddleware", "attach_caller_context", "carrier_from_headers", "refusal_body"]

_BAGGAGE_ONLY = W3CBaggagePropagator()
_BAGGAGE_HEADER: Final = "baggage"
_log = logging.getLogger("otel_guard")

MAX_BAGGAGE_BYTES: Final = 8192
"""The most bytes the ``baggage`` headers of one request may hold, joined: the W3C Baggage limit,
which OpenTelemetry's propagator applies too (it drops a longer header whole, and the chain with it)."""


def carrier_from_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI raw headers as a propagator carrier: lower-case names, repeated headers joined by ``,``.

    Joining is how HTTP combines repeated fields (RFC 9110), and it is what the W3C baggage header
    expects when a proxy split one baggage header in two. Each name's values are joined once, at the
    end. ``baggage`` is read only up to :data:`MAX_BAGGAGE_BYTES`: past it the rest is not read, and
    the carrier has no ``baggage`` at all (one warning names the limit, never the header's text).
    """
    carrier: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    baggage_bytes = -1  # the joined baggage's length so far (no comma before the first)
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name == _BAGGAGE_HEADER:
            if baggage_bytes > MAX_BAGGAGE_BYTES:
                continue
            baggage_bytes += 1 + len(raw_value)
            if baggage_bytes > MAX_BAGGAGE_BYTES:
                continue
        value = raw_value.decode("latin-1")
        if name not in carrier:
            carrier[name] = value
        elif name in repeated:
            repeated[name].append(value)
        else:
            repeated[name] = [carrier[name], value]
    for name, values in repeated.items():
        carrier[name] = ",".join(values)
    if baggage_bytes > MAX_BAGGAGE_BYTES:
        carrier.pop(_BAGGAGE_HEADER, None)
        _log.warning(
            "otel-guard: a request's baggage headers hold more than %d bytes (the W3C limit): "
            "dropped, with any delegation chain in them",
            MAX_BAGGAGE_BYTES,
        )
    return carrier


_reads_baggage: tuple[object, bool] = (None, False)  # the global propagator last asked, its answer


def propagator_reads_baggage() -> bool:
    """Whether the global propagator reads the ``baggage`` header (``OTEL_PROPAGATORS`` has it)."""
    global _reads_baggage
    textmap = propagate.get_global_textmap()
    known, reads = _reads_baggage
    if known is not textmap:
        reads = _BAGGAGE_HEADER in textmap.fields
        _reads_baggage = (textmap, reads)
    return reads


def attach_caller_context(carrier: Mapping[str, str]) -> Token[otel_context.Context] | None:
    """Continue the caller's trace and chain from ``carrier``; return the token to detach, or ``None``.

    When the current context has no span, the whole caller context is extracted by the global
    propagator (its span becomes the parent). When it has one (an OpenTelemetry server middleware or
    the runtime's own tracing started it), that span stays the parent and only the baggage is read,
    and not at all when the chain is already in the context. The ``baggage`` header is read even when
    ``OTEL_PROPAGATORS`` leaves baggage out: without it a loop through this server would go unseen.
    Either way it is read once.
    """
    current = otel_context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        if baggage.get_baggage(CHAIN_BAGGAGE_KEY, current) is not None:
            return None
        ctx = _BAGGAGE_ONLY.extract(carrier, context=current)
    else:
        ctx = propagate.extract(carrier, context=current)
        if not propagator_reads_baggage():
            ctx = _BAGGAGE_ONLY.extract(carrier, context=ctx)
    return otel_context.attach(ctx)


def refusal_body(err: DelegationRefused) -> dict[str, str]:
    """The JSON body of a refused HTTP hop: the contract's code, the reason and the message."""
    return {"error": err.code, "reason": err.reason, "message": str(err)}


class GuardMiddleware:
    """ASGI middleware that guards an HTTP endpoint as the agent ``agent`` (see the module docs)."""

    def __init__(self, app: ASGIApp, *, agent: str, skill: str | SkillOf | None = None) -> None:
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"GuardMiddleware: agent must be a non-empty string, not {agent!r}")
        if skill is not None and not isinstance(skill, str) and not callable(skill):
            raise ValueError(
                f"GuardMiddleware: skill must be a string, None or a callable(scope), not {skill!r}"
            )
        settings_at_start()  # a bad OTEL_GUARD_* value stops the server before it serves anything
        self.app = app
        self.agent = agent
        self.skill = skill

    def _skill_of(self, scope: Scope) -> str | None:
        skill = self.skill
        if callable(skill):
            skill = skill(scope)
        return skill or None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = attach_caller_context(carrier_from_headers(scope.get("headers") or ()))
        try:
            hop = delegate(self.agent, self._skill_of(scope), receiving=True, span_kind=SpanKind.SERVER)
            try:
                hop_context = hop.start()
            except DelegationRefused as err:
                await _send_refusal(send, err)
                return
            hop_token = otel_context.attach(hop_context)
            try:
                await self.app(scope, receive, _reply_without_chain(send))
            except BaseException as exc:
                otel_context.detach(hop_token)
                hop.finish(exc)
                raise
            otel_context.detach(hop_token)
            hop.finish()
        finally:
            if token is not None:
                otel_context.detach(token)


def baggage_without_chain(value: str) -> str:
    """A W3C ``baggage`` header value without its ``otel_guard.chain`` member (the others kept)."""
    members = [member for member in value.split(",") if member.split("=", 1)[0].strip() != CHAIN_BAGGAGE_KEY]
    return ",".join(members).strip()


def headers_without_chain(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """ASGI headers with the chain taken out of every ``baggage`` header (dropped if nothing is left).

    A reply never carries the chain: an app that injects its context into its response headers
    would otherwise hand the client a freshly signed token one hop longer than the one it sent.
    """
    kept = []
    for name, value in headers:
        if name.lower() != b"baggage":
            kept.append((name, value))
        elif rest := baggage_without_chain(value.decode("latin-1")):
            kept.append((name, rest.encode("latin-1")))
    return kept


def _reply_without_chain(send: Send) -> Send:
    async def send_without_chain(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers")
            if headers and any(name.lower() == b"baggage" for name, _ in headers):
                message = {**message, "headers": headers_without_chain(headers)}
        await send(message)

    return send_without_chain


async def _send_refusal(send: Send, err: DelegationRefused) -> None:
    body = json.dumps(refusal_body(err), ensure_ascii=False).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": err.status,
            "headers": [
                (b"content-type", b"application/json; charset=utf-8"),
                (b"content-length", str(len(body)).encode("ascii")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
