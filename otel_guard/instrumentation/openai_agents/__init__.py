"""Guard OpenAI Agents SDK runs, tool calls, agents-as-tools and handoffs: each one is a hop.

Switch it on with ``opentelemetry-instrument`` (extra ``openai-agents``), or in code before the first
run: ``OpenAIAgentsInstrumentor().instrument()``. A handoff's hop is a transfer (a hand-back is no
cycle) and stays open for the rest of the run (:mod:`._scope`); a refusal reaches the model as the
output of the call it made. What is a hop,
what the model sees, what is left out: docs/runtimes/openai-agents.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.util.types import AttributeValue
from wrapt import wrap_function_wrapper

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import (
    GuardInstrumentor,
    PatchTarget,
    refusal_behind,
    refusal_text,
    unless_suppressed,
    unwrap_all,
)
from otel_guard.instrumentation.openai_agents._guidance import guidance_for, with_guidance
from otel_guard.instrumentation.openai_agents._results import (
    INTERNAL_NAMES as _RESULT_NAMES,
)
from otel_guard.instrumentation.openai_agents._results import (
    refused_handoff_step,
    refused_tool_result,
)
from otel_guard.instrumentation.openai_agents._scope import RunScope, current_run
from otel_guard.instrumentation.openai_agents.package import _instruments
from otel_guard.settings import current_settings
from otel_guard.telemetry import GEN_AI_CONVERSATION_ID

if TYPE_CHECKING:
    from agents.result import RunResultStreaming

_RUN: Final = ("agents.run", "AgentRunner.run")
_RUN_STREAMED: Final = ("agents.run", "AgentRunner.run_streamed")
_TOOL_CALL: Final = ("agents.run_internal.tool_execution", "_invoke_function_tool_with_metadata")
_TOOL_CALL_DIRECT: Final = ("agents.tool", "_invoke_function_tool_with_metadata")
_TOOL_FAILURE: Final = ("agents.tool", "maybe_invoke_function_tool_failure_error_function")
_HANDOFF: Final = ("agents.run_internal.turn_resolution", "execute_handoffs")
_TURNS: Final = (
    ("agents.run", "run_single_turn"),
    ("agents.run", "resolve_interrupted_turn"),
    ("agents.run_internal.run_loop", "run_single_turn_streamed"),
    ("agents.run_internal.run_loop", "resolve_interrupted_turn"),
)
_MODEL_INPUT: Final = ("agents.run_internal.run_loop", "maybe_filter_model_input")
_GET_RESPONSE: Final = ("agents.run_internal.run_loop", "get_response_with_retry")
_STREAM_RESPONSE: Final = ("agents.run_internal.run_loop", "stream_response_with_retry")

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    _RUN,
    _RUN_STREAMED,
    _TOOL_CALL,
    _TOOL_CALL_DIRECT,
    _TOOL_FAILURE,
    _HANDOFF,
    *_TURNS,
    _MODEL_INPUT,
    _GET_RESPONSE,
    _STREAM_RESPONSE,
)
"""Every (module, attribute) this instrumentor wraps, patched where the SDK looks it up."""

INTERNAL_NAMES: Final[tuple[PatchTarget, ...]] = (
    *_RESULT_NAMES,
    ("agents.run_internal.run_steps", "NextStepHandoff"),
    ("agents.tool", "default_tool_error_function"),
    ("agents.tool", "resolve_function_tool_failure_error_function"),
    ("agents.result", "RunResultStreaming.run_loop_task"),
    ("agents.run_state", "RunState._current_agent"),
)
"""SDK names this instrumentor reads or builds without patching them."""

_tool_hop: ContextVar[str | None] = ContextVar("otel_guard_openai_agents_tool_hop", default=None)
"""The name of the tool call hop whose body is running: a run of that agent inside it joins it."""


class OpenAIAgentsInstrumentor(GuardInstrumentor):
    """Makes OpenAI Agents SDK runs, tool calls, agents-as-tools and handoffs guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # wrapt imports each target's module here: this module imports without the runtime.
        wrap_function_wrapper(*_RUN, _guard_run)
        wrap_function_wrapper(*_RUN_STREAMED, _guard_run_streamed)
        wrap_function_wrapper(*_TOOL_CALL, _guard_tool_call)
        wrap_function_wrapper(*_TOOL_CALL_DIRECT, _guard_tool_call)
        wrap_function_wrapper(*_TOOL_FAILURE, _refusal_as_tool_error)
        wrap_function_wrapper(*_HANDOFF, _guard_handoff)
        for target in _TURNS:
            wrap_function_wrapper(*target, _turn_in_current_agent)
        wrap_function_wrapper(*_MODEL_INPUT, _add_guidance)
        from otel_guard.instrumentation.openai_agents import _usage as usage

        wrap_function_wrapper(*_GET_RESPONSE, usage.guard_get_response)
        wrap_function_wrapper(*_STREAM_RESPONSE, usage.guard_stream_response)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)


# -- runs ---------------------------------------------------------------------------------------


def _run_hop(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Delegation | None:
    """The hop for a run of the starting agent, or ``None`` when the run joins a tool call's hop."""
    agent = args[0] if args else kwargs.get("starting_agent")
    name = getattr(agent, "name", None)
    if not isinstance(name, str) or not name or _tool_hop.get() == name:
        return None
    return delegate(name, attributes=_conversation(kwargs))


def _conversation(kwargs: dict[str, Any]) -> dict[str, AttributeValue] | None:
    """``gen_ai.conversation.id`` of a run: the server-side conversation it continues
    (``conversation_id``), else its ``session``'s id; ``None`` when it has neither."""
    conversation = kwargs.get("conversation_id")
    if not isinstance(conversation, str) or not conversation:
        conversation = getattr(kwargs.get("session"), "session_id", None)
    if not isinstance(conversation, str) or not conversation:
        return None
    return {GEN_AI_CONVERSATION_ID: conversation}


def _resumed_agent(args: tuple[Any, ...], kwargs: dict[str, Any], hop: Delegation | None) -> str | None:
    """The agent in charge when a resumed ``RunState`` was saved, if a handoff had made it so."""
    state = args[1] if len(args) > 1 else kwargs.get("input")
    if hop is None or type(state) in (str, list):  # a new run's input (the usual case)
        return None
    from agents.run_state import RunState

    agent = getattr(state, "_current_agent", None) if isinstance(state, RunState) else None
    name = getattr(agent, "name", None)
    if not isinstance(name, str) or not name or hop is None or name == hop.hop.agent:
        return None
    return name


def _open_run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Delegation | None, RunScope]:
    """Decide the run's hop (raises when refused) and make its scope.

    A run resumed after a handoff re-opens the hop into the agent that was in charge, as the
    handoff did, so the resumed turns run where they ran before the interruption. For
    ``run_streamed``, a sync call that must refuse before it returns: :func:`_aopen_run` is the
    same for a run on the event loop.
    """
    hop = _run_hop(args, kwargs)
    ctx = hop.start() if hop is not None else otel_context.get_current()
    scope = _run_scope(ctx, kwargs)
    resumed = _resumed_agent(args, kwargs, hop)
    if resumed is not None:
        handoff = delegate(resumed, attributes=_conversation(kwargs), transfer=True)
        token = otel_context.attach(ctx)
        try:
            handoff.start()
        except BaseException as exc:
            _close_run(hop, scope, exc)
            raise
        finally:
            otel_context.detach(token)
        scope.handoffs.append(handoff)
    return hop, scope


async def _aopen_run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Delegation | None, RunScope]:
    """:func:`_open_run` awaiting the hops' budget store (``hop.astart``): the loop never waits on it."""
    hop = _run_hop(args, kwargs)
    ctx = await hop.astart() if hop is not None else otel_context.get_current()
    scope = _run_scope(ctx, kwargs)
    resumed = _resumed_agent(args, kwargs, hop)
    if resumed is not None:
        handoff = delegate(resumed, attributes=_conversation(kwargs), transfer=True)
        token = otel_context.attach(ctx)
        try:
            await handoff.astart()
        except BaseException as exc:
            _close_run(hop, scope, exc)
            raise
        finally:
            otel_context.detach(token)
        scope.handoffs.append(handoff)
    return hop, scope


def _run_scope(ctx: otel_context.Context, kwargs: dict[str, Any]) -> RunScope:
    return RunScope(
        context_of_run=ctx,
        server_managed=bool(
            kwargs.get("conversation_id")
            or kwargs.get("previous_response_id")
            or kwargs.get("auto_previous_response_id")
        ),
    )


def _close_run(hop: Delegation | None, scope: RunScope, exc: BaseException | None) -> None:
    scope.close(exc)
    if hop is not None:
        hop.finish(exc)


@unless_suppressed
async def _guard_run(
    wrapped: Callable[..., Awaitable[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``AgentRunner.run(starting_agent, input, **options)``: the run is one hop."""
    hop, scope = await _aopen_run(args, kwargs)
    token = otel_context.attach(scope.context_of_run)
    run_token = current_run.set(scope)
    tool_token = _tool_hop.set(None)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        _close_run(hop, scope, exc)
        raise
    finally:
        _tool_hop.reset(tool_token)
        current_run.reset(run_token)
        otel_context.detach(token)
    _close_run(hop, scope, None)
    return result


@unless_suppressed
def _guard_run_streamed(
    wrapped: Callable[..., RunResultStreaming],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> RunResultStreaming:
    """``AgentRunner.run_streamed(...)``: checked before it returns; the hop ends with the run."""
    # The run goes on in a task the SDK starts here; it copies this context, so the hop and the
    # scope reach it. Refused: DelegationRefused is raised here, before any task exists.
    hop, scope = _open_run(args, kwargs)
    token = otel_context.attach(scope.context_of_run)
    run_token = current_run.set(scope)
    tool_token = _tool_hop.set(None)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        _close_run(hop, scope, exc)
        raise
    finally:
        _tool_hop.reset(tool_token)
        current_run.reset(run_token)
        otel_context.detach(token)
    task = result.run_loop_task
    if task is None:
        _close_run(hop, scope, None)
    else:
        task.add_done_callback(
            lambda done: _close_run(hop, scope, None if done.cancelled() else done.exception())
        )
    return result


def _turn_in_current_agent(
    wrapped: Callable[..., Awaitable[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Awaitable[Any]:
    """One turn of a run: after a handoff it runs inside the handoff's hop.

    Not a coroutine itself: a turn with no handoff to run in (most) is the SDK's own coroutine,
    returned as it is, without a coroutine of the guard's around it (and without asking whether
    instrumentation is suppressed, which only matters to a turn the guard would move).
    """
    scope = current_run.get()
    ctx = scope.context if scope is not None else None
    if ctx is None or not is_instrumentation_enabled():
        return wrapped(*args, **kwargs)
    return _turn_in(ctx, wrapped, args, kwargs)


async def _turn_in(
    ctx: otel_context.Context,
    wrapped: Callable[..., Awaitable[Any]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    token = otel_context.attach(ctx)
    try:
        return await wrapped(*args, **kwargs)
    finally:
        otel_context.detach(token)


# -- tool calls ---------------------------------------------------------------------------------


def _tool_hop_of(tool: Any) -> tuple[str, str] | None:
    """(hop name, kind) for a function tool: an agent-as-tool is its agent; ``None`` if unnamed."""
    agent_name = getattr(getattr(tool, "_agent_instance", None), "name", None)
    if getattr(tool, "_is_agent_tool", False) and isinstance(agent_name, str) and agent_name:
        return agent_name, "agent"
    binding = getattr(tool, "_mcp_tool_binding", None)
    name = binding[1] if binding else getattr(tool, "name", None)
    if not isinstance(name, str) or not name:
        return None
    return name, "tool"


@unless_suppressed
async def _guard_tool_call(
    wrapped: Callable[..., Awaitable[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``_invoke_function_tool_with_metadata(*, function_tool, context, arguments)``: one hop."""
    found = _tool_hop_of(kwargs.get("function_tool"))
    if found is None:
        return await wrapped(*args, **kwargs)
    name, kind = found
    # As acall_in_hop, without a coroutine of its own around the call. Refused on entry, the
    # refusal is the tool's output; one from the body passes on as it is, already past the SDK's
    # failure handling.
    hop = delegate(name, kind="agent" if kind == "agent" else "tool")
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        return refused_tool_result(err)
    token = otel_context.attach(ctx)
    tool_token = _tool_hop.set(name)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        _tool_hop.reset(tool_token)
        otel_context.detach(token)
        hop.finish(exc)
        raise
    _tool_hop.reset(tool_token)
    otel_context.detach(token)
    hop.finish()
    return result


@unless_suppressed
async def _refusal_as_tool_error(
    wrapped: Callable[..., Awaitable[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """The SDK's default tool-failure text, replaced by the refusal's when a refusal failed a tool:
    a refused hop, or the tree budget's refusal of a request in the tool's own agent run (an agent
    used as a tool), so the calling agent's model reads why."""
    result = await wrapped(*args, **kwargs)
    error = kwargs.get("error")
    err = refusal_behind(error)
    text = refusal_text(err) if err is not None else _tree_spent_behind(error)
    if text is None or result is None:
        return result
    from agents.tool import default_tool_error_function, resolve_function_tool_failure_error_function

    # Only the SDK's generic text is replaced; a tool's own failure_error_function decides itself.
    formatter = resolve_function_tool_failure_error_function(kwargs["function_tool"], kwargs.get("context"))
    return text if formatter is default_tool_error_function else result


def _tree_spent_behind(error: object) -> str | None:
    """The text of the tree budget's refusal that ``error`` is or was raised from, else ``None``."""
    from otel_guard.instrumentation.openai_agents._usage import TreeBudgetExceeded

    seen: set[int] = set()
    while isinstance(error, BaseException) and id(error) not in seen:
        if isinstance(error, TreeBudgetExceeded):
            return str(error)
        seen.add(id(error))
        error = error.__cause__
    return None


# -- handoffs -----------------------------------------------------------------------------------


@unless_suppressed
async def _guard_handoff(
    wrapped: Callable[..., Awaitable[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``execute_handoffs(**call)``: a transfer into the target agent, open for the rest of the run.

    A handoff passes control (the agent handing off answers no more in this run): the hop is of kind
    transfer, so handing the conversation back to an agent that handed off is no cycle; a ping-pong
    of handoffs stops at ``max_name_depth`` (or ``max_depth``), its refusal the handoff call's output.
    """
    run_handoffs = kwargs.get("run_handoffs")
    target = getattr(getattr(run_handoffs[0], "handoff", None), "agent_name", None) if run_handoffs else None
    if not isinstance(target, str) or not target:
        return await wrapped(*args, **kwargs)
    hop = delegate(target, transfer=True)
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        return refused_handoff_step(err, kwargs)
    token = otel_context.attach(ctx)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        hop.finish(exc)
        raise
    finally:
        otel_context.detach(token)

    from agents.run_internal.run_steps import NextStepHandoff

    scope = current_run.get()
    if scope is None or not isinstance(getattr(result, "next_step", None), NextStepHandoff):
        hop.finish()  # no run to carry it (or no handoff taken): the hop is just this call
    else:
        scope.handoffs.append(hop)
    return result


# -- situational guidance -----------------------------------------------------------------------


def _add_guidance(
    wrapped: Callable[..., Awaitable[Any]],
    instance: object,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Awaitable[Any]:
    """``maybe_filter_model_input(*, agent, ...)``: the situational prefix on the user turn.

    Whether a prefix can apply is known before the call: when none can (or instrumentation is
    suppressed), the SDK's own coroutine is returned as it is.
    """
    scope = current_run.get()
    # A server-held conversation tracks the items it sent by identity: leave them as they are.
    if (
        scope is None
        or scope.server_managed
        or not current_settings().situational_prompt
        or not is_instrumentation_enabled()
    ):
        return wrapped(*args, **kwargs)
    return _with_guidance(wrapped, args, kwargs)


async def _with_guidance(
    wrapped: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    model_input = await wrapped(*args, **kwargs)
    prefix = guidance_for(kwargs["agent"])
    return with_guidance(model_input, prefix) if prefix is not None else model_input
