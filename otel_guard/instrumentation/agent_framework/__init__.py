"""Guard Microsoft Agent Framework: agent runs, tool calls, agents as tools and handoffs are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``agent-framework``), or in code before the
agents are built: ``AgentFrameworkInstrumentor().instrument()``. The guard is Agent Framework's own
middleware, added to every agent as it is built, so agents built before ``instrument()`` are not
guarded. What is a hop, what the model sees, what is left out: docs/runtimes/agent-framework.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any, Final

from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from wrapt import wrap_function_wrapper

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, PatchWhenImported, unwrap_all
from otel_guard.instrumentation.agent_framework._scope import switch_on
from otel_guard.instrumentation.agent_framework.package import _handoff_instruments, _instruments

_LAYER_INIT: Final = ("agent_framework._middleware", "AgentMiddlewareLayer.__init__")
_INVOKE: Final = ("agent_framework._tools", "FunctionTool.invoke")

_HANDOFF: Final = ("agent_framework_orchestrations._handoff", "_AutoHandoffMiddleware.process")
_TURN: Final = ("agent_framework_orchestrations._handoff", "HandoffAgentExecutor._run_agent_and_emit")

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Where every agent with middleware (Agent, and any agent built on the middleware layer) is
    # built: the guard's run middleware goes first in its middleware.
    _LAYER_INIT,
    # Where every tool call of a run ends up, after the run's function middleware (if any).
    _INVOKE,
)
"""Every (module, attribute) of Agent Framework's core this instrumentor patches."""

HANDOFF_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # A handoff workflow's: where a handoff is requested, and an executor's turn, which runs inside
    # the handoff to it.
    _HANDOFF,
    _TURN,
)
"""What it patches in agent-framework-orchestrations, when installed (at a tested version) and once
the app imports it. Not in ``PATCH_TARGETS``: a package the app may not have never triggers
instrumenting."""

INTERNAL_NAMES: Final[tuple[PatchTarget, ...]] = (
    # The agent a tool of as_tool() runs is read from the function it wraps (_tools.agent_behind).
    ("agent_framework._agents", "BaseAgent.as_tool"),
    # A handoff tool is known by the function it wraps (_handoffs.is_handoff).
    ("agent_framework_orchestrations._handoff", "HandoffAgentExecutor._create_handoff_tool"),
)
"""Agent Framework names this instrumentor relies on without patching them."""


class AgentFrameworkInstrumentor(GuardInstrumentor):
    """Makes Agent Framework agent runs, tool calls, agents as tools and handoffs guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # wrapt imports the target's module here: this module imports without the runtime.
        wrap_function_wrapper(*_LAYER_INIT, _guard_new_agent)
        wrap_function_wrapper(*_INVOKE, _guard_invoke)
        if get_dependency_conflicts(list(_handoff_instruments)) is None:
            _handoff_patch.apply()
        switch_on(True)

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.agent_framework import _runs

        switch_on(False)
        unwrap_all((_LAYER_INIT, _INVOKE))
        _handoff_patch.remove()
        _runs.remove_all()


def _guard_new_agent(
    wrapped: Callable[..., None], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``AgentMiddlewareLayer.__init__``: the agent, built, gets the guard's run middleware."""
    wrapped(*args, **kwargs)
    from otel_guard.instrumentation.agent_framework import _runs

    _runs.install(instance)


def _guard_invoke(
    wrapped: Callable[..., Awaitable[Any]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Awaitable[Any]:
    from otel_guard.instrumentation.agent_framework import _tools

    return _tools.guard_invoke(wrapped, instance, args, kwargs)


def _guard_handoff(
    wrapped: Callable[..., Awaitable[None]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Awaitable[None]:
    from otel_guard.instrumentation.agent_framework import _handoffs

    return _handoffs.guard_handoff(wrapped, instance, args, kwargs)


def _guard_turn(
    wrapped: Callable[..., Awaitable[None]], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Awaitable[None]:
    from otel_guard.instrumentation.agent_framework import _handoffs

    return _handoffs.guard_turn(wrapped, instance, args, kwargs)


# Handoffs come in agent-framework-orchestrations, which an app that never builds a handoff workflow
# never imports: it is patched when the app first does.
_handoff_patch = PatchWhenImported(_HANDOFF[0], (_HANDOFF, _guard_handoff), (_TURN, _guard_turn))
