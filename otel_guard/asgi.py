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
   member) with ``delegate(agent, skill, receiving=True)``: a chain whose last hop is already this
   agent (the caller's client instrumentation added it) is checked again, not extended,
3. runs the app inside that hop, so the app's own outgoing calls carry the extended chain (any
   OpenTelemetry propagator injects it), and ends the ``invoke_agent {agent}`` span when the app is done.

What a reader would not guess: the agent named ``agent`` that the app runs (a pydantic-ai or
OpenAI Agents agent, an ``@agentic`` function) *is* this hop, not a second one: its run joins the
request's hop (:func:`otel_guard.guard.joinable`), so a service costs one place in the chain. And a
:class:`~otel_guard.DelegationRefused` that escapes the app (a hop inside it refused, or another
service's refusal raised by an instrumented HTTP client) is answered 409 as below, never 500,
unless the app had already started its response. Requests whose path matches ``excluded_urls``
(``OTEL_GUARD_EXCLUDED_URLS``: health checks, metrics) pass through as no hop.

That span is the agent's run in this process (kind INTERNAL, as the GenAI conventions define
``invoke_agent`` for an agent in the process); the request's SERVER span is the HTTP
instrumentation's (an OpenTelemetry ASGI middleware outside this one), whose child it then is.

A refused hop never reaches the app. The caller gets ``409 Conflict`` and a JSON body::

    {"error": "a2a_delegation_cycle",
     "reason": "cycle",
     "message": "Delegation cycle: agent planner is already in chain planner → budget",
     "agent": "planner", "skill": "plan"}

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
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context

from otel_guard._carriers import attach_caller_context, carrier_from_headers, headers_without_chain
from otel_guard._start import settings_at_start
from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate, joinable
from otel_guard.settings import current_settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
SkillOf = Callable[[Scope], str | None]

__all__ = ["GuardMiddleware", "refusal_body"]


def refusal_body(err: DelegationRefused) -> dict[str, str]:
    """The JSON body of a refused HTTP hop: the contract's code, the reason, the message, and the
    refused hop's agent (and skill, when it has one), which an instrumented client raises again."""
    body = {"error": err.code, "reason": err.reason, "message": str(err), "agent": err.hop.agent}
    if err.hop.skill is not None:
        body["skill"] = err.hop.skill
    return body


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
        if scope["type"] != "http" or _excluded(scope):
            await self.app(scope, receive, send)
            return
        token = attach_caller_context(lambda: carrier_from_headers(scope.get("headers") or ()))
        try:
            hop = delegate(self.agent, self._skill_of(scope), receiving=True)
            try:
                hop_context = await hop.astart()
            except DelegationRefused as err:
                await _send_refusal(send, err)
                return
            reply = _Reply(send)
            hop_token = otel_context.attach(joinable(hop, hop_context))
            try:
                await self.app(scope, receive, reply)
            except DelegationRefused as err:  # a hop inside refused, and the app let it through
                otel_context.detach(hop_token)
                hop.finish(err)
                if reply.started:
                    raise  # too late for a 409: the server ends the response as for any error
                await _send_refusal(send, err)
                return
            except BaseException as exc:
                otel_context.detach(hop_token)
                hop.finish(exc)
                raise
            otel_context.detach(hop_token)
            hop.finish()
        finally:
            if token is not None:
                otel_context.detach(token)


def _excluded(scope: Scope) -> bool:
    """Whether the request's path is one of ``excluded_urls`` (no hop: health checks, metrics)."""
    excluded = current_settings().excluded_urls
    return bool(excluded) and excluded.excludes(scope.get("path") or "")


class _Reply:
    """The app's ``send``, with the chain taken out of the reply's ``baggage`` headers, and noting
    whether the response has started (after that a refusal can no longer be answered 409)."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = message.get("headers")
            if headers:
                for name, _ in headers:  # a loop, not any(<generator>): every response pays it
                    if name.lower() == b"baggage":
                        message = {**message, "headers": headers_without_chain(headers)}
                        break
        await self.send(message)


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
