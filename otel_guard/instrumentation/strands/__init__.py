"""Guard Strands Agents: agent runs, tool calls, agents as tools and swarm handoffs are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``strands``), or in code before the agents are
built: ``StrandsInstrumentor().instrument()``. The guard is Strands' own hooks, added to every
``Agent`` and ``Swarm`` as it is built, so agents built before ``instrument()`` are not guarded. A
swarm handoff is a transfer (a hand-back is no cycle: :mod:`._swarm`). What is a hop, what the model
sees, what is left out: docs/runtimes/strands.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Final

from wrapt import wrap_function_wrapper

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, PatchWhenImported, unwrap_all
from otel_guard.instrumentation.strands._scope import switch_on
from otel_guard.instrumentation.strands.package import _instruments

_AGENT_INIT: Final = ("strands.agent.agent", "Agent.__init__")
_SWARM_INIT: Final = ("strands.multiagent.swarm", "Swarm.__init__")

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Where every Agent is built: the guard's hooks are added after Strands' own and the plugins'.
    _AGENT_INIT,
    # Where every Swarm is built: the hooks that keep a handoff open until its target has run.
    # Patched when the app first imports strands.multiagent.
    _SWARM_INIT,
)
"""Every (module, attribute) this instrumentor patches."""


class StrandsInstrumentor(GuardInstrumentor):
    """Makes Strands agent runs, tool calls, agents as tools and swarm handoffs guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # wrapt imports the target's module here: this module imports without the runtime.
        wrap_function_wrapper(*_AGENT_INIT, _guard_new_agent)
        _swarm_patch.apply()
        switch_on(True)

    def _uninstrument(self, **kwargs: Any) -> None:
        # Agents built meanwhile keep the hooks (Strands cannot take them off): they do nothing now.
        switch_on(False)
        unwrap_all((_AGENT_INIT,))
        _swarm_patch.remove()


def _guard_new_agent(
    wrapped: Callable[..., None], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``Agent.__init__``: the agent, built, gets the guard's run and tool-call hooks (its model
    middleware comes with its first run under a model budget)."""
    wrapped(*args, **kwargs)
    from otel_guard.instrumentation.strands import _runs, _tools

    _runs.install(instance)
    _tools.install(instance)


def _guard_new_swarm(
    wrapped: Callable[..., None], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``Swarm.__init__``: the swarm, built, gets the hooks that keep its handoffs open."""
    wrapped(*args, **kwargs)
    from otel_guard.instrumentation.strands import _swarm

    _swarm.install(instance)


# ``import strands`` does not import ``strands.multiagent`` (25 ms more of start-up, measured), so an
# app that never builds a ``Swarm`` never pays for importing it.
_swarm_patch = PatchWhenImported(_SWARM_INIT[0], (_SWARM_INIT, _guard_new_swarm))
