"""Agent and team runs as hops: ``Agent.run`` / ``arun`` and ``Team.run`` / ``arun``.

A run is a hop ``invoke_agent {name}`` (the agent's or team's ``name``, else its ``id``, else its
class name) around the whole run; a streamed run (``stream=True``) keeps its hop open until its
events end, and each event is made inside the hop's context. A run inside a tool call of its own
name is that call's hop. A team member run by its leader's delegation tool is a hop into the member:
a transfer (docs/spec.md §9) when the team hands control over (``mode=TeamMode.route`` or
``respond_directly=True``: the leader answers with the member's response), a call otherwise. A
refused run raises :class:`~otel_guard.DelegationRefused` before it starts; inside a tool call the
call records it, so its error result carries the refusal's text (:mod:`._tools`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from agno.exceptions import AgentRunException
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import acall_in_context, unless_suppressed
from otel_guard.instrumentation.agno._guidance import guided
from otel_guard.instrumentation.agno._scope import CALL, TEAM, call_in_progress
from otel_guard.settings import current_settings
from otel_guard.telemetry import GEN_AI_CONVERSATION_ID


class RunRefused(DelegationRefused, AgentRunException):  # type: ignore[misc, unused-ignore]  # Any without agno
    """A run refused inside a tool call: a :class:`~otel_guard.DelegationRefused` that Agno takes as
    its own ``AgentRunException`` (a tool's deliberate stop, logged at debug level, not as a crash
    with its traceback). The tool call answers it as its error result (:mod:`._tools`)."""


def agent_name(agent: Any) -> str:
    for attribute in ("name", "id"):
        value = getattr(agent, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(agent).__name__


def _conversation(instance: Any, kwargs: dict[str, Any]) -> dict[str, AttributeValue] | None:
    """``gen_ai.conversation.id`` of a run: the session it runs in (the run's ``session_id``, else the
    agent's or team's), if any."""
    session_id = kwargs.get("session_id") or getattr(instance, "session_id", None)
    return {GEN_AI_CONVERSATION_ID: session_id} if isinstance(session_id, str) and session_id else None


def _start(instance: Any, kwargs: dict[str, Any]) -> tuple[Delegation | None, Context]:
    """The run's hop (``None``: it joins the tool call it runs in) and the context to run it in."""
    name = agent_name(instance)
    call = call_in_progress()
    team = instance if hasattr(instance, "members") else None  # a Team: its leader's tools delegate
    if call is not None and call.name == name:
        return None, Context({**otel_context.get_current(), CALL: None, TEAM: team})
    hop = delegate(
        name, transfer=call is not None and call.transfer, attributes=_conversation(instance, kwargs)
    )
    try:
        ctx = hop.start()
    except DelegationRefused as err:
        if call is None:
            raise
        call.refusal = err
        raise RunRefused(err.reason, str(err), err.hop, err.chain, remote=err.remote) from None
    return hop, Context({**ctx, CALL: None, TEAM: team})


@unless_suppressed
def guard_run(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.run`` / ``Team.run``: the run is one hop (a stream's stays open over its events)."""
    hop, ctx = _start(instance, kwargs)
    token = otel_context.attach(ctx)
    try:
        if current_settings().situational_prompt:
            args, kwargs = guided(instance, agent_name(instance), agent_name, args, kwargs)
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        if hop is not None:
            hop.finish(exc)
        raise
    otel_context.detach(token)
    if isinstance(result, Iterator):
        return events_in(result, ctx, hop)
    if hop is not None:
        hop.finish()
    return result


@unless_suppressed
def guard_arun(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.arun`` / ``Team.arun``: a coroutine (or, streamed, an async iterator) run in one hop,
    decided when it is first awaited (or iterated). Its guidance is read from the caller's chain."""
    if current_settings().situational_prompt:
        args, kwargs = guided(instance, agent_name(instance), agent_name, args, kwargs)
    result = wrapped(*args, **kwargs)
    if isinstance(result, AsyncIterator):
        return _astream_in_hop(instance, kwargs, result)
    return _arun_in_hop(instance, kwargs, result)


async def _arun_in_hop(instance: Any, kwargs: dict[str, Any], run: Awaitable[Any]) -> Any:
    try:
        hop, ctx = _start(instance, kwargs)
    except BaseException:
        close = getattr(run, "close", None)
        if close is not None:
            close()  # never awaited: no "coroutine was never awaited" warning
        raise
    return await acall_in_context(ctx, hop, lambda: run)


async def _astream_in_hop(
    instance: Any, kwargs: dict[str, Any], events: AsyncIterator[Any]
) -> AsyncIterator[Any]:
    hop, ctx = _start(instance, kwargs)
    outcome: BaseException | None = None
    try:
        while True:
            token = otel_context.attach(ctx)
            try:
                event = await anext(events)
            except StopAsyncIteration:
                return
            finally:
                otel_context.detach(token)
            yield event
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        if hop is not None:
            hop.finish(outcome)


def events_in(events: Iterator[Any], ctx: Context, hop: Delegation | None) -> Iterator[Any]:
    """The events of ``events``, each made inside ``ctx``; ``hop`` ends when they end."""
    outcome: BaseException | None = None
    try:
        while True:
            token = otel_context.attach(ctx)
            try:
                event = next(events)
            except StopIteration:
                return
            finally:
                otel_context.detach(token)
            yield event
    except GeneratorExit:
        raise
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        if hop is not None:
            hop.finish(outcome)
