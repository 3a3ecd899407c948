"""Tool calls as hops: ``FunctionCall.execute`` / ``aexecute``, and what a refusal gives the model.

Every tool call an Agno model makes is run by ``FunctionCall.execute`` (``aexecute`` in async runs),
which answers a ``FunctionExecutionResult``: ``success`` with the result, or ``failure`` with an
``error`` that the model reads as the tool call's result. A call is a hop ``execute_tool {name}``;
a refused call is not run and answers ``failure`` with
:func:`~otel_guard.instrumentation._base.refusal_text` (reason, path, do not retry), so the model
answers with what it has. A run refused inside the tool (an agent it runs) fails the call the same
way, with the refusal's text in place of Agno's ``str(exception)``.

A team leader's delegation tools (``delegate_task_to_member``, ``delegate_task_to_members``) are no
hop of their own: the member's run inside is the hop into the member (:mod:`._runs`), a transfer
when the team hands control over. Their results are generators that Agno iterates after the call
returns (the member runs then): each step of a generator result runs inside the call's context,
and the call's hop ends when it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import refusal_text, unless_suppressed
from otel_guard.instrumentation.agno._runs import RunRefused
from otel_guard.instrumentation.agno._scope import CALL, TEAM, Call

_DELEGATIONS: Final = frozenset({"delegate_task_to_member", "delegate_task_to_members"})
"""A team leader's tools that run members (Agno's own names)."""


def _call_of(function_call: Any) -> Call | None:
    name = getattr(function_call.function, "name", None)
    if not isinstance(name, str) or not name:
        return None
    if name in _DELEGATIONS:
        team = _team_running()
        return Call(None, transfer=team is not None and _hands_over(team))
    return Call(name)


def _team_running() -> Any:
    return otel_context.get_value(TEAM)


def _hands_over(team: Any) -> bool:
    """Whether ``team`` hands control to the member it delegates to (route mode, respond directly)."""
    mode = getattr(team, "mode", None)
    return bool(getattr(team, "respond_directly", False)) or getattr(mode, "value", mode) == "route"


def _refused_result(function_call: Any, err: DelegationRefused) -> Any:
    from agno.tools.function import FunctionExecutionResult

    text = refusal_text(err)
    function_call.error = text
    return FunctionExecutionResult(status="failure", error=text)


def _start(function_call: Any) -> tuple[Call, Delegation | None, Context] | Any:
    """The call, its hop and its context; or, refused, the refusal's failed result."""
    call = _call_of(function_call)
    if call is None:
        return None
    hop = None if call.name is None else delegate(call.name, kind="tool")
    try:
        ctx = otel_context.get_current() if hop is None else hop.start()
    except DelegationRefused as err:
        return _refused_result(function_call, err)
    return call, hop, Context({**ctx, CALL: call})


def _finished(function_call: Any, result: Any, call: Call, hop: Delegation | None, ctx: Context) -> Any:
    """The call's result: a refusal inside put in as its text, a generator's steps in the call."""
    if call.refusal is not None and getattr(result, "status", None) == "failure":
        result = _refused_result(function_call, call.refusal)
    value = getattr(result, "result", None)
    if isinstance(value, Iterator):
        result.result = function_call.result = _steps_of(value, hop, ctx)
        return result
    if isinstance(value, AsyncIterator):
        result.result = function_call.result = _asteps_of(value, hop, ctx)
        return result
    if hop is not None:
        hop.finish()
    return result


def _steps_of(steps: Iterator[Any], hop: Delegation | None, ctx: Context) -> Iterator[Any]:
    """A generator result's steps, each inside the call's context; a run refused inside ends them
    with the refusal's text as the last step (Agno adds a text step to the call's result)."""
    outcome: BaseException | None = None
    try:
        while True:
            token = otel_context.attach(ctx)
            try:
                step = next(steps)
            except StopIteration:
                return
            except DelegationRefused as err:
                outcome = err
                yield refusal_text(err)
                return
            finally:
                otel_context.detach(token)
            yield step
    except GeneratorExit:
        raise
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        if hop is not None:
            hop.finish(outcome)


async def _asteps_of(steps: AsyncIterator[Any], hop: Delegation | None, ctx: Context) -> AsyncIterator[Any]:
    """:func:`_steps_of` for an async generator result."""
    outcome: BaseException | None = None
    try:
        while True:
            token = otel_context.attach(ctx)
            try:
                step = await anext(steps)
            except StopAsyncIteration:
                return
            except DelegationRefused as err:
                outcome = err
                yield refusal_text(err)
                return
            finally:
                otel_context.detach(token)
            yield step
    except GeneratorExit:
        raise
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        if hop is not None:
            hop.finish(outcome)


@unless_suppressed
def guard_execute(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``FunctionCall.execute``: the call is one hop."""
    started = _start(instance)
    if started is None:
        return wrapped(*args, **kwargs)
    if not isinstance(started, tuple):
        return started  # refused
    call, hop, ctx = started
    token = otel_context.attach(ctx)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        if hop is not None:
            hop.finish(exc)
        if isinstance(exc, RunRefused):
            return _refused_result(instance, exc)
        raise
    otel_context.detach(token)
    return _finished(instance, result, call, hop, ctx)


@unless_suppressed
async def guard_aexecute(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``FunctionCall.aexecute``: as :func:`guard_execute`, awaited."""
    started = _start(instance)
    if started is None:
        return await wrapped(*args, **kwargs)
    if not isinstance(started, tuple):
        return started
    call, hop, ctx = started
    token = otel_context.attach(ctx)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        if hop is not None:
            hop.finish(exc)
        if isinstance(exc, RunRefused):
            return _refused_result(instance, exc)
        raise
    otel_context.detach(token)
    return _finished(instance, result, call, hop, ctx)
