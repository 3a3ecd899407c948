"""Agent runs as hops: ``BeforeInvocationEvent`` / ``AfterInvocationEvent`` hooks on every ``Agent``.

Every entry point of a Strands agent (``agent(...)``, ``invoke_async``, ``stream_async``, an agent
run as a tool or as a swarm or graph node) goes through one invocation, which starts Strands'
``invoke_agent {name}`` span and then fires ``BeforeInvocationEvent`` inside it, before the prompt
is added to the history and before any model call. There the run becomes a hop:

* a run of the agent a tool call in progress is for (an agent offered as a tool, a tool named like
  the agent it runs) joins that call's hop: one call, one hop, whichever of the two names it;
* the run of a swarm node that a handoff made the one in charge runs in the handoff's hop, which
  ends with the run (:mod:`._swarm`);
* any other run is a hop ``invoke_agent {agent.name}``. A refused run raises
  :class:`~otel_guard.DelegationRefused` from the hook, so the run never starts: Strands ends its
  span with the error and the caller gets the exception (inside a tool, the tool fails with the
  refusal's text: :mod:`._calls`).

The run's context (its chain, the hop's span, :data:`RUN`) is attached in the first hook and detached
in ``AfterInvocationEvent``, which Strands fires when the invocation ends, however it ends (a run
whose stream is dropped unclosed ends there too, from whatever context closes it: the hop still
ends). The hooks are ordered ``SDK_FIRST`` (before) and ``SDK_LAST`` (after), so the other hooks of
the run run inside the hop.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true`` the first hook also leads the invocation's user turn
with the situational guidance (:mod:`._guidance`), and with a model budget on it gives the
agent the middleware that counts its model requests (:mod:`._usage`).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from otel_guard.guard import delegate
from otel_guard.instrumentation.strands._guidance import guided_messages
from otel_guard.instrumentation.strands._scope import CALL, RUN, Call, Run, guarding
from otel_guard.instrumentation.strands._swarm import in_handoff_chain, take_handoff
from otel_guard.instrumentation.strands._usage import count_requests_of
from otel_guard.settings import current_settings
from otel_guard.telemetry import GEN_AI_CONVERSATION_ID


def install(agent: Any) -> None:
    """Add the run hooks to a newly built ``Agent``."""
    from strands.hooks import AfterInvocationEvent, BeforeInvocationEvent, HookOrder

    runs = AgentRuns()
    agent.add_hook(runs.started, BeforeInvocationEvent, order=HookOrder.SDK_FIRST)
    agent.add_hook(runs.ended, AfterInvocationEvent, order=HookOrder.SDK_LAST)


class AgentRuns:
    """The run hooks of one agent, and its runs whose hop is open (newest last): a run's end finds
    its own there when the context it ends in is not the run's (a stream dropped unclosed, which
    the event loop closes from elsewhere)."""

    def __init__(self) -> None:
        self.open: list[Run] = []

    async def started(self, event: Any) -> None:
        """``BeforeInvocationEvent``: the run becomes a hop (or joins the call it is for)."""
        if not guarding():
            return
        agent = event.agent
        name = agent.name
        parent = otel_context.get_current()
        call = otel_context.get_value(CALL, parent)
        handoff = take_handoff(event.invocation_state, agent)
        if handoff is not None:
            run = Run(handoff, ends_hop=True)
            ctx = in_handoff_chain(handoff, parent)
        elif isinstance(call, Call) and call.name == name:
            run = Run(call.hop, ends_hop=False)
            ctx = parent
        else:
            hop = delegate(name, attributes=_conversation(agent))
            ctx = await hop.astart()  # a refusal raises here: the run never starts
            run = Run(hop, ends_hop=True)
        # What runs inside is this run's own: no tool call of its caller's is in progress there.
        ctx = Context({**ctx, CALL: None, RUN: run})  # one copy, not two
        run.token = otel_context.attach(ctx)
        self.open.append(run)
        settings = current_settings()
        if settings.model_budgets_on:
            count_requests_of(agent)
        if settings.situational_prompt:
            guided = guided_messages(agent, event.messages)
            if guided is not None:
                event.messages = guided

    def ended(self, event: Any) -> None:
        """``AfterInvocationEvent``: the run's context is detached and its hop ends.

        Not switched off with the guard: what a run opened is closed however the run ends.
        """
        runs = self.open
        if not runs:
            return
        run = otel_context.get_value(RUN)
        if isinstance(run, Run) and run in runs:
            assert run.token is not None
            otel_context.detach(run.token)
        else:
            # Not in the run's own context (its stream was dropped and is closed from elsewhere):
            # nothing to detach here, but the run's hop still ends.
            run = runs[-1]
        runs.remove(run)
        if run.ends_hop:
            run.hop.finish()


def _conversation(agent: Any) -> dict[str, AttributeValue] | None:
    """``gen_ai.conversation.id`` of a run of ``agent``: its session manager's session id, if any."""
    session_id = getattr(getattr(agent, "_session_manager", None), "session_id", None)
    return {GEN_AI_CONVERSATION_ID: session_id} if isinstance(session_id, str) and session_id else None
