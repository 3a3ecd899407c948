"""An ADK agent run is one hop ``invoke_agent {agent.name}``, from its first event to its last.

Imported only where ADK is installed (the instrumentor imports it when it patches ADK).

The hop wraps the run's event stream: ``BaseAgent.run_async`` (every agent, every way it is started:
a runner's root, a sub-agent, a transfer's target, an ``AgentTool``'s run) and ``LlmAgent._run_impl``
(an LLM agent run as a node of ADK 2's node runtime, which re-enters ``run_async`` once per round of
task delegations: with the hop there, the rounds are one run). The stream's context is attached around
each of its steps only (:mod:`otel_guard._steps`), and the hop ends when the stream ends, fails or is
closed early.

Why not the plugin's ``before_agent_callback`` / ``after_agent_callback``: ADK 2 closes an agent's
stream early on every transfer and task delegation (the node runtime stops reading it and moves on),
and then calls neither ``after_agent_callback`` nor ``on_agent_error_callback``, so a hop ended there
would never end. And the callbacks run inside ADK's own ``invoke_agent`` span, where the hop's span
could not be the parent of ADK's.

When ADK makes the run's stream (it reads it at once, in the same context), in this order:

1. a hop handed over to this agent in this invocation (a transfer, a single-turn or task sub-agent
   call, decided when the model asked for it: see :mod:`._calls`) is opened: the run is that
   hop. A handed-over refusal (a task delegation the guard refused) ends the run at once: a node run
   answers with one event whose output is the refusal's ``{"error": ...}``, which ADK hands the
   delegating model as the task's function response; any other run raises it;
2. when the chain in force already ends with this agent, the run joins that hop: the call that led
   here (an ``AgentTool`` call, an A2A server's hop, a tool of the same name) is the hop, and a second
   one for the same call would be a false cycle;
3. a remote agent whose A2A send is guarded makes no hop (see :mod:`._remote`);
4. otherwise the run is a new hop. Refused, it raises :class:`~otel_guard.DelegationRefused` from its
   first step, before ADK runs anything of the agent's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, Callable
from typing import Any

from google.adk.events.event import Event
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.util.types import AttributeValue

from otel_guard._steps import Done, async_generator_in_context
from otel_guard.chain import normal_name
from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, current_chain, delegate
from otel_guard.instrumentation.google_adk._calls import calls, in_hop
from otel_guard.instrumentation.google_adk._remote import hopped_by_a2a
from otel_guard.instrumentation.google_adk._tools import refusal_response
from otel_guard.telemetry import GEN_AI_CONVERSATION_ID

Stream = Callable[..., AsyncIterable[Any]]
Refused = Callable[[str, str, DelegationRefused], AsyncGenerator[Any, None]]
"""What a run that was refused before it started yields instead (agent, invocation id, refusal)."""


def guard_run_async(wrapped: Stream, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``BaseAgent.run_async(parent_context)``: the run's stream, as a hop."""
    parent_context = args[0] if args else kwargs.get("parent_context")
    invocation_id = getattr(parent_context, "invocation_id", None)
    return _run_as_hop(instance, parent_context, invocation_id, _raise_at_first_step, wrapped, args, kwargs)


def guard_node_run(wrapped: Stream, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``LlmAgent._run_impl(*, ctx, node_input)``: the node's run (all its rounds), as a hop."""
    ctx = kwargs.get("ctx")
    invocation_id = getattr(ctx, "invocation_id", None)
    return _run_as_hop(instance, ctx, invocation_id, _answer_with_refusal, wrapped, args, kwargs)


def conversation(context: object) -> dict[str, AttributeValue] | None:
    """``gen_ai.conversation.id`` of a run in ``context`` (an invocation, callback or tool context):
    its ADK session's id, or ``None``."""
    session_id = getattr(getattr(context, "session", None), "id", None)
    return {GEN_AI_CONVERSATION_ID: session_id} if isinstance(session_id, str) and session_id else None


def _run_as_hop(
    agent: Any,
    context: object,
    invocation_id: object,
    refused: Refused,
    wrapped: Stream,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    name = agent.name
    if not isinstance(name, str) or not name:
        return wrapped(*args, **kwargs)
    # Decided when ADK makes the run's stream, in the context it then reads the stream in at once. A
    # run that joins a hop (or makes none) is the runtime's stream untouched: no step of it is ours,
    # so whether instrumentation is suppressed is asked only of a run that would be a hop.
    waiting = isinstance(invocation_id, str) and calls.waiting(invocation_id, name)
    if (not waiting and (_in_own_hop(name) or hopped_by_a2a(agent))) or not is_instrumentation_enabled():
        return wrapped(*args, **kwargs)
    handed_over = calls.take_over(str(invocation_id), name) if waiting else None
    if isinstance(handed_over, DelegationRefused):
        return refused(name, str(invocation_id), handed_over)

    async def enter() -> tuple[otel_context.Context, Done]:
        if handed_over is not None:
            return in_hop(handed_over.open(), handed_over), handed_over.finish
        hop: Delegation = delegate(name, attributes=conversation(context))
        return in_hop(await hop.astart(), hop), hop.finish

    return async_generator_in_context(enter, wrapped)(*args, **kwargs)


def _in_own_hop(name: str) -> bool:
    """Whether the chain in force ends with ``name``: the run is the call that chain's last hop made."""
    chain = current_chain()
    return chain is not None and chain.hops[-1].agent == normal_name(name)


async def _raise_at_first_step(
    agent: str, invocation_id: str, err: DelegationRefused
) -> AsyncGenerator[Any, None]:
    raise err
    yield  # an async generator, like the run it stands in for


async def _answer_with_refusal(
    agent: str, invocation_id: str, err: DelegationRefused
) -> AsyncGenerator[Any, None]:
    # The node's output is what ADK answers the delegating model's call with.
    yield Event(invocation_id=invocation_id, author=agent, output=refusal_response(err))
