"""Guard Strands Agents: agent runs, tool calls, agents as tools and swarm handoffs are hops.

Install with ``pip install 'otel-guard[strands]'`` and run the program under
``opentelemetry-instrument``, or instrument it in code before the agents are built::

    from otel_guard.instrumentation.strands import StrandsInstrumentor

    StrandsInstrumentor().instrument()

The guard uses Strands' own extension points: every ``Agent`` gets its hooks as it is built (the
patch of ``Agent.__init__`` adds them after Strands' own and the plugins'), and every ``Swarm`` its
hooks (``Swarm.__init__``). Agents built before ``instrument()`` are not guarded.

What is a hop
    * An agent run: ``invoke_agent {agent.name}``, from ``BeforeInvocationEvent`` to
      ``AfterInvocationEvent``, whichever entry point started it (:mod:`._runs`).
    * A tool call: ``execute_tool {tool}``; a ``BeforeToolCallEvent`` hook gives the call a proxy of
      its tool whose stream is the hop (:mod:`._tools`). An agent offered as a tool
      (``agent.as_tool()``, or an ``Agent`` in another agent's ``tools``) is one hop
      ``invoke_agent {agent.name}``, and a tool that runs an agent of its own name is one hop: the
      agent's run joins the call's hop (:mod:`._calls`).
    * A swarm handoff (``handoff_to_agent``): ``invoke_agent {target}``, open until the target node
      has run, so a handoff back to a node already on the path is a cycle (:mod:`._swarm`).
    * A graph node's run is the node agent's run, a hop from the graph's context: the edges of a
      ``Graph`` are not hops, and its own ``max_node_executions`` bounds its cycles.

What a refusal looks like
    A refused tool call, agent-as-tool call or handoff never runs: the model receives Strands' own
    failed tool result (``status: "error"``) whose text gives the reason, the path and "do not call
    it again", and the run goes on; the model answers with what it has. A tool whose sub-agent run
    was refused fails with the same text. A refused run outside any tool raises
    :class:`~otel_guard.DelegationRefused` from ``agent(...)``, before the model is called.

Spans
    Strands makes its own span of each call (``invoke_agent``, ``execute_tool``); the guard's hop
    span is a child of Strands' span of the same call, in the same trace, refused calls included,
    and only the guard's carries the ``otel_guard.*`` attributes. What a call runs (the agent a
    tool runs) nests under the hop's span.

Model requests and tokens
    With ``max_model_requests`` or ``max_tokens`` on, each model request is checked against the
    run's tree before it is sent and its tokens counted after (:mod:`._usage`); a tree that
    has spent its budget ends the run the way Strands' own ``limits=`` do, with the stop reason
    ``limit_turns`` or ``limit_total_tokens``.

Situational guidance
    With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent whose tools include an agent on its call
    path gets :func:`otel_guard.prompt.guidance_for` at the start of its user turn, never in its
    system prompt (:mod:`._guidance`).

Limits
    The chain stays in the process unless a client carries it: Strands' ``MCPClient`` puts the
    OpenTelemetry context (W3C baggage, the chain with it) into each request's ``_meta``, and an
    HTTP client under OpenTelemetry's instrumentation sends it as ``baggage``. Bidirectional
    (``BidiAgent``) agents are not guarded; background tool tasks are not tested. A tool call that
    another hook renames without choosing its tool is not a hop.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from typing import Any, Final

from wrapt import register_post_import_hook, wrap_function_wrapper

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
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


class _PatchWhenImported:
    """A patch applied when its module is imported: now, if the app has imported it already.

    ``import strands`` does not import ``strands.multiagent`` (25 ms more of start-up, measured),
    so an app that never builds a ``Swarm`` never pays for importing it.
    """

    def __init__(self, target: PatchTarget, wrapper: Callable[..., None]) -> None:
        self._target = target
        self._wrapper = wrapper
        self._wanted = False
        self._applied = False
        self._hooked = False

    def apply(self) -> None:
        self._wanted = True
        module = self._target[0]
        if module in sys.modules:
            self._patch()
        elif not self._hooked:
            self._hooked = True  # a post-import hook cannot be taken back: it checks _wanted
            register_post_import_hook(lambda _module: self._patch(), module)

    def remove(self) -> None:
        self._wanted = False
        if self._applied:
            self._applied = False
            unwrap_all((self._target,))

    def _patch(self) -> None:
        if self._wanted and not self._applied:
            self._applied = True
            wrap_function_wrapper(*self._target, self._wrapper)


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


_swarm_patch = _PatchWhenImported(_SWARM_INIT, _guard_new_swarm)
