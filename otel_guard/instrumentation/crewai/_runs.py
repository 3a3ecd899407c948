"""Agent runs as hops: ``Agent.execute_task`` (a task of a crew, or a coworker's delegated task) and
``Agent.kickoff`` (an agent on its own), and their async forms.

A run is a hop ``invoke_agent {role}`` around the whole call, so the model calls, tool calls and
delegations of the run happen inside it. A run joins the hop it is already in instead of adding
another when that hop has its name (see :attr:`~._scope.Scope.joinable`). A refused run raises
:class:`~otel_guard.DelegationRefused` before CrewAI builds its executor; inside a tool's body the
refusal is also noted on the tool call, whose after hook hands it to the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import call_in_hop, unless_suppressed
from otel_guard.instrumentation.crewai._hooks import need_model_hooks
from otel_guard.instrumentation.crewai._names import agent_name
from otel_guard.instrumentation.crewai._scope import (
    AgentRun,
    current_scope,
    enter_run,
    in_run,
    leave_run,
    note_refusal,
)


def _hop_of(agent: Any) -> tuple[AgentRun, Delegation | None]:
    """The run and its hop; ``None`` for a run that joins the hop of the same name it is in.

    A run refused once inside a tool call is refused again at once, with no second span: CrewAI's
    text-format tool calling tries a tool whose body failed up to six times.
    """
    need_model_hooks(agent)  # before CrewAI builds the run's executor, which copies them
    run = AgentRun(agent, agent_name(agent))
    scope = current_scope()
    call = scope.call
    if call is not None and call.refusal is not None and call.refusal.hop.agent == run.name:
        raise call.refusal
    return run, None if scope.joinable == run.name else delegate(run.name)


@unless_suppressed
def guard_run(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.execute_task``: the run is one hop."""
    run, hop = _hop_of(instance)
    if hop is None:
        entered = enter_run(run)
        try:
            return wrapped(*args, **kwargs)
        finally:
            leave_run(entered)
    return call_in_hop(
        hop, lambda: wrapped(*args, **kwargs), enter=lambda: in_run(run, hop.start()), refused=_refused
    )


def guard_kickoff(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.kickoff``: the run is one hop, made by ``kickoff_async`` when kickoff defers to it."""
    if _in_event_loop():
        # Inside an event loop kickoff only returns kickoff_async(...), whose own wrapper makes the hop.
        return wrapped(*args, **kwargs)
    return guard_run(wrapped, instance, args, kwargs)


@unless_suppressed
async def guard_run_async(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.aexecute_task`` and ``Agent.kickoff_async``: the run is one hop.

    The hop is made here, not with ``acall_in_hop``: this is then the only coroutine between
    CrewAI's caller and its own, and CrewAI raises thousands of exceptions a run (attribute look-ups
    with a default), each of which walks the coroutines running."""
    run, hop = _hop_of(instance)
    if hop is None:
        entered = enter_run(run)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            leave_run(entered)
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        _refused(err)
    entered = enter_run(run, ctx)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        leave_run(entered)
        hop.finish(exc)
        raise
    leave_run(entered)
    hop.finish()
    return result


def _refused(err: DelegationRefused) -> NoReturn:
    """This run's own hop was refused: noted on the tool call it runs in, then raised (a refusal from
    inside the run passes as it is)."""
    note_refusal(err)
    raise err


def _in_event_loop() -> bool:
    """CrewAI's own test (``is_inside_event_loop``) for whether ``kickoff`` defers to ``kickoff_async``."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
