"""What a CrewAI agent run and a tool call in progress leave in the context for the code after them.

CrewAI reports a tool call to two hooks, one before and one after it, and a model call to two more;
between them run the tool's body or the model. These records carry what the guard decided in one
hook to the hooks that follow and to the agent runs nested in a tool's body. They live in the
OpenTelemetry context, under one key, beside the hop's span and chain: the guard attaches that
context anyway, and CrewAI copies it into the threads and tasks it runs agents, tools and parallel
tool calls in, so each branch sees its own.

No context variable of the guard's own: CrewAI's contexts hold 13 variables where a run starts and
up to 22 inside it, and CPython keeps a context in a HAMT whose root turns from a bitmap node into a
32-slot array node past 16 variables, after which every ``ContextVar.set`` CrewAI makes copies the
array (with three variables of the guard's, a callgrind diff of a one-tool run showed array-node
copies +300 k instructions against the bitmap node's -130 k; with one, +50 k against -28 k). And a
run or a tool call makes one attach where it made an attach and a set.
"""

from __future__ import annotations

from contextvars import Token
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, cast

from opentelemetry import context
from opentelemetry.context import Context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation


@dataclass(slots=True)
class AgentRun:
    """One run of an agent (``execute_task`` / ``kickoff``), its hop its own or one it joined."""

    agent: Any
    name: str
    guided: bool = False  # its user turn has been given the situational guidance, or did not need it


@dataclass(slots=True)
class ToolCall:
    """One tool call between its before and after hooks.

    ``tool_input`` is how the after hook knows its call: CrewAI hands the same argument dict to both
    hooks of one call. ``hop`` is ``None`` when the call was refused before its body.
    """

    tool_input: dict[str, Any]
    hop: Delegation | None
    refusal: DelegationRefused | None = None
    token: Token[Context] | None = None  # the context the before hook attached (its hop's, with this call)


class Scope(NamedTuple):
    """Where a context stands: its innermost run and tool call, and the hop a run there may join."""

    run: AgentRun | None = None
    """The innermost agent run in this context."""
    call: ToolCall | None = None
    """The tool call whose body is running here, until an agent run starts inside it."""
    joinable: str | None = None
    """The name of the innermost hop this instrumentation opened (or joined) here.

    An agent run of that name is the same call, not a new hop: a tool named like the agent it runs,
    a delegation's coworker run, or CrewAI running an agent again from inside its own run (the retry
    of a failed ``execute_task``, a resumed checkpoint). A tool call in between sets its own name, so
    a run that comes back through a tool is a new hop and a cycle.
    """


_OUTSIDE: Final = Scope()  # no run, no call: a context CrewAI's runs have not entered
_KEY: Final = context.create_key("otel_guard_crewai")


def current_scope() -> Scope:
    """Where the current context stands."""
    return cast(Scope, context.get_current().get(_KEY, _OUTSIDE))


def current_run() -> AgentRun | None:
    """The innermost agent run in this context."""
    return current_scope().run


def current_call() -> ToolCall | None:
    """The tool call whose body is running here (see :attr:`Scope.call`)."""
    return current_scope().call


def _with(scope: Scope, ctx: Context | None) -> Context:
    """``ctx`` (default: the current context) with ``scope`` in it."""
    base = context.get_current() if ctx is None else ctx
    return Context({**base, _KEY: scope})


def in_run(run: AgentRun, ctx: Context | None = None) -> Context:
    """``ctx`` (its hop's context; default: the current one, for a run that joins the hop it is in)
    with ``run`` the innermost run and no tool call in progress inside it yet."""
    return _with(Scope(run, None, run.name), ctx)


def enter_run(run: AgentRun, ctx: Context | None = None) -> Token[Context]:
    """Attach :func:`in_run`'s context."""
    return context.attach(in_run(run, ctx))


def leave_run(token: Token[Context]) -> None:
    """Undo :func:`enter_run`."""
    context.detach(token)


def enter_call(call: ToolCall, name: str | None, ctx: Context | None = None) -> None:
    """Make ``call`` the tool call in progress (``name``: its hop's, for the runs it joins), in
    ``ctx`` (its hop's context; default: the current one, for a call refused before its body)."""
    call.token = context.attach(_with(current_scope()._replace(call=call, joinable=name), ctx))


def leave_call(call: ToolCall) -> None:
    """Undo :func:`enter_call` (the after hook runs in the context the before hook ran in)."""
    if call.token is not None:
        context.detach(call.token)
        call.token = None


def note_refusal(err: DelegationRefused) -> None:
    """Remember a refused agent run on the tool call whose body it ran in, if any, so the after hook
    can hand the refusal to the model in place of CrewAI's generic error text."""
    call = current_call()
    if call is not None and call.refusal is None:
        call.refusal = err
