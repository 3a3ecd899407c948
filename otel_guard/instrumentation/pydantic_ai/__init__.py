"""Guard pydantic-ai: every agent run and every tool call is a hop.

Switch it on with ``opentelemetry-instrument`` (extra ``pydantic-ai``), or in code:
``PydanticAIInstrumentor().instrument()``. Every run entry point goes through ``Agent.iter``, so a run
is one hop however it was started; a refused tool call reaches the model as pydantic-ai's own
``ToolFailed``. What is a hop, what the model sees, what is left out: docs/runtimes/pydantic-ai.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from contextvars import ContextVar, Token
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import wrapt
from opentelemetry.context import Context, attach, detach
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import (
    GuardInstrumentor,
    PatchTarget,
    refusal_text,
    unless_suppressed,
    unwrap_all,
)
from otel_guard.instrumentation.pydantic_ai._guidance import guidance_for, prefixed_prompt
from otel_guard.instrumentation.pydantic_ai.package import _instruments
from otel_guard.settings import current_settings

if TYPE_CHECKING:
    from pydantic_ai.agent import Agent
    from pydantic_ai.tool_manager import ValidatedToolCall

PATCH_TARGETS: tuple[PatchTarget, ...] = (
    # Every run entry point (run, run_sync, run_stream, run_stream_events, iter) opens its run here.
    ("pydantic_ai.agent", "Agent.iter"),
    # The one public door of a validated tool call: below it sit the capability hooks (and with them
    # pydantic-ai's own execute_tool span), then the toolset's call_tool.
    ("pydantic_ai.tool_manager", "ToolManager.execute_tool_call"),
)

_AGENT_WITHOUT_NAME = "agent"

# The name of the tool call whose body is running in this context, until an agent run starts inside
# it. An agent run of the same name is that same call (an agent exposed as a tool under its own name)
# and must not become a second hop; any agent run clears it, so a run cannot be merged with a tool
# call further up the chain.
_tool_call_in_progress: ContextVar[str | None] = ContextVar("otel_guard_pydantic_ai_tool_call", default=None)


class PydanticAIInstrumentor(GuardInstrumentor):
    """Makes pydantic-ai agent runs and tool calls guarded hops (see the module docstring)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        import pydantic_ai.agent
        import pydantic_ai.tool_manager  # noqa: F401

        (agent_module, agent_run), (tool_module, tool_call) = PATCH_TARGETS
        wrapt.wrap_function_wrapper(agent_module, agent_run, _guard_agent_run)
        wrapt.wrap_function_wrapper(tool_module, tool_call, _guard_tool_call)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)


# -- agent runs ---------------------------------------------------------------------------------


def _guard_agent_run(
    wrapped: Callable[..., Any], instance: Agent[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Agent.iter``: the run becomes a hop, entered when the caller enters the run."""
    # Not @unless_suppressed: pydantic-ai infers an unnamed agent's name from the frame that called
    # this one (see _agent_name), which must be the app's, not a decorator's.
    if not is_instrumentation_enabled():
        return wrapped(*args, **kwargs)
    name = _agent_name(instance, kwargs, inspect.currentframe())
    settings = current_settings()
    if settings.situational_prompt:
        args, kwargs = _with_guidance(instance, name, args, kwargs)
    if settings.model_budgets_on:
        from otel_guard.instrumentation.pydantic_ai._usage import with_tree_budget

        kwargs = with_tree_budget(kwargs)
    return _AgentRunHop(name, wrapped, args, kwargs)


class _AgentRunHop:
    """The run's hop around ``Agent.iter``'s own context manager, entered when the caller enters it.

    The hop's context stays attached while the caller iterates the run inside its ``async with``,
    which is where pydantic-ai drives the graph (model requests, tool calls, nested runs). A run
    inside the tool call of the same name is that call, which is already the hop. A class, not an
    ``asynccontextmanager``: no generator of the guard's between the caller and the run.
    """

    __slots__ = ("_args", "_hop", "_inner", "_kwargs", "_name", "_previous", "_token", "_wrapped")
    _hop: Delegation | None
    _token: Token[Context]
    _previous: Token[str | None]
    _inner: Any  # Agent.iter's own async context manager

    def __init__(
        self, name: str, wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self._name = name
        self._wrapped = wrapped
        self._args = args
        self._kwargs = kwargs

    async def __aenter__(self) -> Any:
        hop = None if _tool_call_in_progress.get() == self._name else delegate(self._name, kind="agent")
        if hop is not None:
            self._token = attach(await hop.astart())  # refused: raised here, nothing entered
        self._hop = hop
        self._previous = _tool_call_in_progress.set(None)
        try:
            inner = self._wrapped(*self._args, **self._kwargs)
            run = await inner.__aenter__()
        except BaseException as exc:
            self._leave(exc)
            raise
        self._inner = inner
        return run

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        try:
            suppressed = bool(await self._inner.__aexit__(exc_type, exc, tb))
        except BaseException as error:
            self._leave(error)
            raise
        self._leave(None if suppressed else exc)
        return suppressed

    def _leave(self, exc: BaseException | None) -> None:
        _tool_call_in_progress.reset(self._previous)
        hop = self._hop
        if hop is not None:
            detach(self._token)
            hop.finish(exc)


def _agent_name(agent: Agent[Any, Any], kwargs: dict[str, Any], frame: FrameType | None) -> str:
    """The agent's name; an unnamed agent gets the name pydantic-ai would infer from the caller."""
    if agent.name is None and kwargs.get("infer_name", True):
        # pydantic-ai infers the name inside `iter` from its caller's frame, which is now ours: infer it
        # here from the real caller (the frame above this wrapper) so the name matches pydantic-ai's.
        infer = getattr(agent, "_infer_name", None)
        if infer is not None:
            infer(frame)
    return agent.name or _AGENT_WITHOUT_NAME


def _with_guidance(
    agent: Agent[Any, Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The run's arguments with the situational prefix leading the user prompt, when it applies."""
    run_toolsets: Sequence[Any] | None = kwargs.get("toolsets")
    prefix = guidance_for(name, agent.toolsets, run_toolsets)
    if prefix is None:
        return args, kwargs
    if args:
        return (prefixed_prompt(prefix, args[0]), *args[1:]), kwargs
    if kwargs.get("user_prompt") is None:
        return args, kwargs
    return args, {**kwargs, "user_prompt": prefixed_prompt(prefix, kwargs["user_prompt"])}


# -- tool calls ---------------------------------------------------------------------------------


@unless_suppressed
async def _guard_tool_call(
    wrapped: Callable[..., Any], instance: object, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``ToolManager.execute_tool_call``: the call becomes a hop; a refusal becomes a failed result."""
    validated: ValidatedToolCall[Any] = args[0] if args else kwargs["validated"]
    if not _executes_tool(validated):
        # A call that failed validation or was deferred is passed in only to be reported: no hop.
        return await wrapped(*args, **kwargs)
    name = validated.call.tool_name
    # As `async with delegate(...)`, without its enter and exit coroutines. Refused on entry, or the
    # tool's own sub-agent run was refused: either way the model must see why in pydantic-ai's own
    # tool-failure form, and the run goes on.
    hop = delegate(name, kind="tool")
    try:
        ctx = await hop.astart()
    except DelegationRefused as err:
        raise _tool_failure(validated, err, wrap=kwargs.get("wrap_validation_errors", True)) from err
    token = attach(ctx)
    previous = _tool_call_in_progress.set(name)
    try:
        result = await wrapped(*args, **kwargs)
    except BaseException as exc:
        _tool_call_in_progress.reset(previous)
        detach(token)
        hop.finish(exc)
        if isinstance(exc, Exception) and (isinstance(exc, DelegationRefused) or _tree_spent(exc)):
            raise _tool_failure(validated, exc, wrap=kwargs.get("wrap_validation_errors", True)) from exc
        raise
    _tool_call_in_progress.reset(previous)
    detach(token)
    hop.finish()
    return result


def _executes_tool(validated: ValidatedToolCall[Any]) -> bool:
    tool = validated.tool
    return (
        validated.args_valid
        and validated.deferral is None
        and tool is not None
        and tool.tool_def.kind != "output"
    )


def _tree_spent(exc: BaseException) -> bool:
    """Whether ``exc`` is the tree budget's refusal of a model request in the tool's sub-agent run."""
    from otel_guard.instrumentation.pydantic_ai._usage import TreeBudgetExceeded

    return isinstance(exc, TreeBudgetExceeded)


def _tool_failure(validated: ValidatedToolCall[Any], err: Exception, *, wrap: bool) -> Exception:
    """The refusal as pydantic-ai reports a tool that failed terminally (``ToolFailed``).

    ``ToolFailed`` tells the model the call is done and failed, without retry instructions and
    without spending the tool's retry budget. With ``wrap`` (the agent graph's way) it comes as the
    ``ToolFailedError`` holding the failed tool result, exactly as ``ToolManager`` wraps a
    ``ToolFailed`` raised by a tool; without it, raw, as ``ToolManager`` then passes errors on.
    """
    from pydantic_ai.exceptions import ToolFailed, ToolFailedError
    from pydantic_ai.messages import ToolReturnPart

    text = refusal_text(err) if isinstance(err, DelegationRefused) else str(err)
    if not wrap:
        return ToolFailed(text)
    call = validated.call
    return ToolFailedError(
        ToolReturnPart(
            tool_name=call.tool_name,
            content=text,
            tool_call_id=call.tool_call_id,
            tool_kind=call.tool_kind,
            outcome="failed",
        )
    )
