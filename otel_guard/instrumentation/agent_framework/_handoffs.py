"""Handoffs as hops: a handoff is a transfer into the agent it hands off to, open until that agent has run.

``HandoffBuilder`` (agent-framework-orchestrations) gives each participant a tool
``handoff_to_{target}`` per target. The call never reaches a tool body: a function middleware of the
workflow's own (``_AutoHandoffMiddleware``) answers it with ``{"handoff_to": target}`` and ends the
function loop, and once the run has ended the target's executor runs the target in the next
superstep, from the workflow's loop: nothing in the call stack links the target's run to the agent
that chose it. No middleware of the guard's reaches either place (the handoff middleware is the
agent's own, and comes before the guard's), so two patches link them:

* ``_AutoHandoffMiddleware.process``: a handoff call is a hop ``invoke_agent {target}`` of kind
  transfer, decided there, in the handing-off agent's run: the chain is ``… → planner ⇒ budget``.
  A refused handoff is not taken: the call's result is the refusal's text (the handoff middleware
  is not called), the model reads it and answers, and the workflow goes on as after any answer (it
  asks the user, or ends on its termination condition);
* ``HandoffAgentExecutor._run_agent_and_emit``, an executor's turn: an allowed handoff waits (by the
  workflow's ``State`` and the target's id) for its target's next turn, which runs inside it. The
  target's run joins that hop (the chain already ends with it); the hop ends with the turn (its
  autonomous-mode continuations included).

What a reader would not guess: the workflow's own words say so. A handoff passes control (the
agent handing off has ended its turn and waits for no answer: ``HandoffBuilder``'s agents "transfer
control to each other"), so it is a transfer: ``budget`` handing the conversation back to
``planner`` is no cycle (the customer-support shape, triage → specialist → triage), and a ping-pong
of handoffs, which neither the per-agent ``autonomous_mode_turn_limit`` (reset at every handoff) nor
anything short of the workflow's superstep limit bounds, stops at ``max_name_depth`` or
``max_depth``. An agent that still waits (one whose tool runs the workflow) is a cycle all the same.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from agent_framework import MiddlewareTermination
from opentelemetry import context as otel_context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import refusal_text
from otel_guard.instrumentation.agent_framework._scope import CALL, TURN, Call, guarding

HANDOFF_TOOL: Final = "HandoffAgentExecutor._create_handoff_tool.<locals>._handoff_tool"
"""The qualified name of the function of every tool ``HandoffBuilder`` makes for a handoff."""


def is_handoff(tool: Any) -> bool:
    """Whether ``tool`` is one of a handoff workflow's ``handoff_to_{target}`` tools."""
    return getattr(getattr(tool, "func", None), "__qualname__", None) == HANDOFF_TOOL


_waiting: weakref.WeakKeyDictionary[Any, dict[str, Delegation]] = weakref.WeakKeyDictionary()
"""By a workflow's ``State``: the allowed handoffs whose targets have not had their turn yet."""


@dataclass(frozen=True)
class Turn:
    """An executor's turn: where the handoffs its agent makes wait for their targets (``waiting``, the
    workflow's), and the ones it made (``made``)."""

    waiting: dict[str, Delegation]
    made: list[Delegation] = field(default_factory=list)

    def drop_made(self, exc: BaseException) -> None:
        """The turn failed: no handoff it made will be taken. They end, with its error."""
        for target, hop in list(self.waiting.items()):
            if any(hop is made for made in self.made):
                del self.waiting[target]
                hop.finish(exc)


async def guard_handoff(
    wrapped: Callable[..., Awaitable[None]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``_AutoHandoffMiddleware.process``: the handoff is a transfer into its target, or not taken."""
    context = args[0] if args else kwargs["context"]
    targets = getattr(instance, "_handoff_functions", None)
    function = getattr(context, "function", None)
    target = targets.get(getattr(function, "name", None)) if isinstance(targets, dict) else None
    if not (guarding() and isinstance(target, str) and target):
        await wrapped(*args, **kwargs)
        return
    hop = delegate(target, transfer=True)
    try:
        await hop.astart()
    except DelegationRefused as err:
        context.result = refusal_text(err)  # the handoff middleware is not called: no handoff
        return
    try:
        await wrapped(*args, **kwargs)  # records the handoff and ends the function loop on purpose
    except MiddlewareTermination:
        _wait_for_target(target, hop)
        raise
    except BaseException as exc:
        hop.finish(exc)  # no handoff was recorded
        raise
    _wait_for_target(target, hop)


def _wait_for_target(target: str, hop: Delegation) -> None:
    """Keep an allowed handoff open for its target's turn."""
    turn = otel_context.get_value(TURN)
    if not isinstance(turn, Turn):
        hop.finish()  # no executor's turn to carry it: the hop is the decision alone
        return
    earlier = turn.waiting.pop(target, None)
    if earlier is not None:
        earlier.finish()  # an earlier handoff to the same target, whose turn never came
    turn.waiting[target] = hop
    turn.made.append(hop)


async def guard_turn(
    wrapped: Callable[..., Awaitable[None]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``HandoffAgentExecutor._run_agent_and_emit``: the turn runs inside the handoff to it, if any."""
    ctx = args[0] if args else kwargs["ctx"]
    state = getattr(ctx, "state", None)
    if not guarding() or state is None:
        await wrapped(*args, **kwargs)
        return
    waiting = _waiting.setdefault(state, {})
    name = str(instance.id)
    handoff = waiting.pop(name, None)
    base = otel_context.get_current()
    if handoff is not None and handoff.context is not None:
        # The target's run joins the handoff's hop, as an agent's run joins the call it is for.
        base = otel_context.set_value(CALL, Call(name, handoff), handoff.context)
    turn = Turn(waiting)
    token = otel_context.attach(otel_context.set_value(TURN, turn, base))
    try:
        await wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        turn.drop_made(exc)
        if handoff is not None:
            handoff.finish(exc)
        raise
    otel_context.detach(token)
    if handoff is not None:
        handoff.finish()
