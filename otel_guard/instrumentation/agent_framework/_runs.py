"""Agent runs as hops: an ``AgentMiddleware`` first in every agent's middleware.

Every run of an Agent Framework agent (``agent.run(...)``, streamed or not, an agent run by
``as_tool()`` or by a workflow's executor) goes through the agent's middleware pipeline before
anything of the run happens: before its session and context providers are read, before Agent
Framework's ``invoke_agent`` span starts, before any model call. The guard's :class:`AgentRuns`, the
first of the agent's agent middleware, makes the run a hop there:

* a run of the agent a tool call in progress is for (an agent offered as a tool, a tool named like
  the agent it runs) joins that call's hop: one call, one hop;
* any other run is a hop ``invoke_agent {agent name}``. A refused run raises
  :class:`~otel_guard.DelegationRefused` from the middleware, so it never starts; inside a tool, the
  tool's result is the refusal's text (:mod:`._tools`).

A run that is not streamed is the middleware's ``call_next()``. A streamed run only begins there:
``call_next()`` gives back the run's ``ResponseStream``, and the run happens while the caller reads
it, maybe in another task. So the hop stays open with the stream: around each pull of it (Agent
Framework's ``with_pull_context_manager``, the way its own telemetry keeps its span current) the
run's chain is put in the context, and the hop ends with the stream's cleanup (read to its end,
failed or closed), or when a stream never read to its end is collected.

Each of the run's tool calls is a hop where the tool is invoked (:mod:`._tools`, within the run's
:data:`RUN`). With a model budget on, the middleware also puts the guard's chat middleware
(:mod:`._usage`) after the run's own, so each model request is counted.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from contextvars import Token
from types import TracebackType
from typing import Any, Final

from agent_framework import (
    AgentContext,
    AgentMiddleware,
    ChatMiddlewareLayer,
    MiddlewareTermination,
    ResponseStream,
)
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from otel_guard.guard import delegate
from otel_guard.instrumentation.agent_framework._guidance import guide
from otel_guard.instrumentation.agent_framework._scope import CALL, RUN, Call, Run, agent_name, guarding
from otel_guard.instrumentation.agent_framework._usage import MODEL_REQUESTS
from otel_guard.settings import current_settings
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY, GEN_AI_CONVERSATION_ID


def _conversation(context: AgentContext) -> dict[str, AttributeValue] | None:
    """``gen_ai.conversation.id`` of a run: its session's service-side conversation id, the one Agent
    Framework's own spans name (a session kept locally has none)."""
    session_id = getattr(getattr(context, "session", None), "service_session_id", None)
    return {GEN_AI_CONVERSATION_ID: session_id} if isinstance(session_id, str) and session_id else None


class AgentRuns(AgentMiddleware):  # type: ignore[misc, unused-ignore]  # Any without the runtime
    """Agent middleware: each run is a hop (or joins the tool call it is for)."""

    async def process(self, context: AgentContext, call_next: Callable[[], Awaitable[None]]) -> None:
        if not guarding():
            await call_next()
            return
        name = agent_name(context.agent)
        parent = otel_context.get_current()
        call = otel_context.get_value(CALL, parent)
        if isinstance(call, Call) and call.name == name:
            run = Run(call.hop, ends_hop=False)
            ctx = parent
        else:
            hop = delegate(name, attributes=_conversation(context))
            ctx = await hop.astart()  # a refusal raises here: the run never starts
            run = Run(hop, ends_hop=True)
        settings = current_settings()
        if settings.model_budgets_on:
            _count_requests_of(context)
        # What runs inside is this run's own: no tool call of its caller's is in progress there.
        token = otel_context.attach(Context({**ctx, CALL: None, RUN: run}))  # one copy, not two
        try:
            if settings.situational_prompt:
                guide(context, name)  # in the run's hop: the path it names ends with this run
            await call_next()
        except MiddlewareTermination:
            # A later middleware ended the run on purpose (Agent Framework's own way to stop one).
            otel_context.detach(token)
            run.end()
            raise
        except BaseException as exc:
            otel_context.detach(token)
            run.end(exc)
            raise
        otel_context.detach(token)
        stream = context.result
        if context.stream and isinstance(stream, ResponseStream):
            _open_while_read(stream, run)
        else:
            run.end()


RUNS: Final = AgentRuns()
"""The one instance every guarded agent carries."""

_guarded: weakref.WeakSet[Any] = weakref.WeakSet()
"""The agents built while instrumented, which carry :data:`RUNS`."""


def install(agent: Any) -> None:
    """Put the run middleware first in a newly built agent's middleware.

    Once: an agent built with another's middleware (a handoff workflow's clone of each participant)
    carries it already, and a second one would make each of its runs two hops of the same agent.
    """
    middleware = list(agent.middleware or ())
    agent.middleware = [RUNS, *(item for item in middleware if item is not RUNS)]
    _guarded.add(agent)


def remove_all() -> None:
    """Take the run middleware off every agent that carries it."""
    for agent in list(_guarded):
        middleware = agent.middleware
        if isinstance(middleware, list) and RUNS in middleware:
            agent.middleware = [item for item in middleware if item is not RUNS]
    _guarded.clear()


def _count_requests_of(context: AgentContext) -> None:
    """Put the guard's chat middleware after the run's own chat middleware, which Agent Framework
    hands to the chat client in ``client_kwargs``.

    Only where the agent's chat client has the layer that takes it: a client without it would hand
    ``middleware=`` on to its provider call.
    """
    if not isinstance(getattr(context.agent, "client", None), ChatMiddlewareLayer):
        return
    existing = context.client_kwargs.get("middleware")
    if existing is None:
        middleware: list[Any] = []
    elif isinstance(existing, list | tuple):
        middleware = list(existing)
    else:
        middleware = [existing]
    context.client_kwargs["middleware"] = [*middleware, MODEL_REQUESTS]


def _open_while_read(stream: ResponseStream[Any, Any], run: Run) -> None:
    """Keep ``run``'s hop open while its stream is read: its chain in the context of every pull,
    the hop ended with the stream."""
    hop_context = run.hop.context
    chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY, hop_context) if hop_context is not None else None
    stream.with_pull_context_manager(lambda: _InRun(run, chain))
    stream.with_cleanup_hook(run.end)
    dropped = weakref.finalize(stream, run.end)  # a stream dropped before its end
    dropped.atexit = False  # at exit the SDK has shut down: nothing left to record the span


class _InRun:
    """Around one pull of a run's stream: the run's chain and :data:`RUN` in the context (the span
    current there, Agent Framework's ``invoke_agent``, left as it is); a pull that fails is noted as
    the error the run ends with."""

    def __init__(self, run: Run, chain: object) -> None:
        self._run = run
        self._chain = chain
        self._token: Token[Context] | None = None

    def __enter__(self) -> None:
        ctx = otel_context.get_current()
        if self._chain is not None:
            ctx = baggage.set_baggage(CHAIN_BAGGAGE_KEY, self._chain, ctx)
        self._token = otel_context.attach(Context({**ctx, CALL: None, RUN: self._run}))

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._token is not None:
            otel_context.detach(self._token)
        if exc is not None and not isinstance(exc, StopAsyncIteration):
            self._run.error = exc
