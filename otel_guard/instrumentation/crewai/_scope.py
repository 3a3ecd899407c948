"""What a CrewAI agent run and a tool call in progress leave in the context for the code after them.

CrewAI reports a tool call to two hooks, one before and one after it, and a model call to two more;
between them run the tool's body or the model. These records carry what the guard decided in one
hook to the hooks that follow and to the agent runs nested in a tool's body. They live in context
variables, which CrewAI copies into the threads and tasks it runs agents, tools and parallel tool
calls in, so each branch sees its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

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
    hop_context: Token[Context] | None = None  # the hop's OpenTelemetry context, attached by the before hook
    tokens: tuple[Token[ToolCall | None], Token[str | None]] | None = None  # what the before hook set


current_run: ContextVar[AgentRun | None] = ContextVar("otel_guard_crewai_run", default=None)
"""The innermost agent run in this context."""

current_call: ContextVar[ToolCall | None] = ContextVar("otel_guard_crewai_call", default=None)
"""The tool call whose body is running here, until an agent run starts inside it."""

joinable: ContextVar[str | None] = ContextVar("otel_guard_crewai_joinable", default=None)
"""The name of the innermost hop this instrumentation opened (or joined) here.

An agent run of that name is the same call, not a new hop: a tool named like the agent it runs, a
delegation's coworker run, or CrewAI running an agent again from inside its own run (the retry of a
failed ``execute_task``, a resumed checkpoint). A tool call in between sets its own name, so a run
that comes back through a tool is a new hop and a cycle.
"""


@contextmanager
def inside_run(run: AgentRun) -> Iterator[None]:
    """Make ``run`` the innermost run, with no tool call in progress inside it yet."""
    tokens = (current_run.set(run), current_call.set(None), joinable.set(run.name))
    try:
        yield
    finally:
        joinable.reset(tokens[2])
        current_call.reset(tokens[1])
        current_run.reset(tokens[0])


def enter_call(call: ToolCall, name: str | None) -> None:
    """Make ``call`` the tool call in progress (``name``: its hop's, for the runs it joins)."""
    call.tokens = (current_call.set(call), joinable.set(name))


def leave_call(call: ToolCall) -> None:
    """Undo :func:`enter_call` (the after hook runs in the context the before hook ran in)."""
    if call.tokens is not None:
        call_token, joinable_token = call.tokens
        joinable.reset(joinable_token)
        current_call.reset(call_token)


def note_refusal(err: DelegationRefused) -> None:
    """Remember a refused agent run on the tool call whose body it ran in, if any, so the after hook
    can hand the refusal to the model in place of CrewAI's generic error text."""
    call = current_call.get()
    if call is not None and call.refusal is None:
        call.refusal = err
