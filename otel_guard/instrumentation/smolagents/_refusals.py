"""What a refused call looks like to a smolagents model: the step's tool error, with the refusal's text.

smolagents hands a failed tool call to the model as the error of the step that made it: the
exception ends the step, the agent keeps it as ``ActionStep.error``, and the next model request
reads it as a tool response (``Error:\\n{error}\\nNow let's retry: ...``). The error is smolagents' own
wrapping of the tool's exception, "Error executing tool 'x' with arguments ...: DelegationRefused:
... Please try again or use another tool" (a managed agent: "... request to team member ...";
a CodeAgent's code: "Code execution failed at line ... due to: DelegationRefused: ..."), which tells
the model to retry. The guard's step callback, given to each agent at its first guarded run, puts an
``AgentToolExecutionError`` with :func:`refusal_text` in its place when the step's error was caused
by a refusal and carries its message (a tool that caught the refusal and failed otherwise keeps its
own error). Step callbacks run when the step ends, before the step enters the memory the next
request is made from; those the agent was built with run before the guard's and see smolagents' text.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

from smolagents.memory import ActionStep
from smolagents.utils import AgentToolExecutionError

from otel_guard.errors import DelegationRefused
from otel_guard.instrumentation._base import refusal_text
from otel_guard.instrumentation.smolagents._scope import guarding

_watched: weakref.WeakSet[Any] = weakref.WeakSet()
"""The agents that have the guard's step callback."""


def watch(agent: Any) -> None:
    """Give ``agent`` the step callback, once."""
    if agent not in _watched:
        _watched.add(agent)
        agent.step_callbacks.register(ActionStep, refusal_to_model)


def refusal_to_model(step: Any, agent: Any) -> None:
    """``ActionStep`` callback: a step that failed on a refusal fails with the refusal's text."""
    error = step.error
    if error is None or not guarding():
        return
    refusal = refusal_in(error)
    if refusal is None:
        return
    text = refusal_text(refusal)
    if str(error) == text:
        return  # already the refusal's own
    replaced = AgentToolExecutionError(text, agent.logger)
    replaced.__cause__ = refusal
    step.error = replaced


# smolagents asks each step callback for its signature at every step it ends (``inspect.signature``:
# about 50 calls each time, to tell a one-parameter callback from one that takes the agent too).
# A callable's own ``__signature__`` is what ``inspect.signature`` answers first (13 calls).
refusal_to_model.__signature__ = inspect.signature(refusal_to_model)  # type: ignore[attr-defined]


def refusal_in(error: BaseException) -> DelegationRefused | None:
    """The refusal ``error`` was raised from (by ``raise ... from`` or in its ``except`` block), when
    ``error``'s message carries the refusal's: smolagents re-raises a tool's exception as its text."""
    message = str(error)
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, DelegationRefused):
            return cause if str(cause) in message else None
        seen.add(id(cause))
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return None
