"""Guard Google ADK: agent runs, tool calls, agents as tools, transfers and task delegations are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``google-adk``), or in code before the runners are
made: ``GoogleADKInstrumentor().instrument()``. Most of it is ADK's own extension point, a plugin put
first on every ``Runner`` (:mod:`._plugin`); only what a plugin cannot reach is patched
(``PATCH_TARGETS``). What is a hop, what the model sees, what is left out: docs/runtimes/google-adk.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.google_adk.package import _instruments

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Every runner, InMemoryRunner and the ones ADK makes (AgentTool, A2A server): the plugin goes on.
    ("google.adk.runners", "Runner.__init__"),
    # Every agent run's event stream, however the run is started.
    ("google.adk.agents.base_agent", "BaseAgent.run_async"),
    # An LLM agent run as a node (ADK 2's node runtime): its rounds and the task agents it dispatches.
    ("google.adk.agents.llm_agent", "LlmAgent._run_impl"),
    # Where ADK counts each model request against max_llm_calls: the tree's budget, the same error.
    ("google.adk.agents.invocation_context", "InvocationContext.increment_llm_call_count"),
)
"""Every (module, attribute) this instrumentor wraps."""


class GoogleADKInstrumentor(GuardInstrumentor):
    """Makes Google ADK agent runs, tool calls, agents as tools and transfers guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Imported here, not at module level: this module imports without ADK installed.
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.google_adk import _plugin as plugin
        from otel_guard.instrumentation.google_adk import _runs as runs
        from otel_guard.instrumentation.google_adk import _usage as usage

        wrappers: tuple[Callable[..., Any], ...] = (
            plugin.add_guard_plugin,
            runs.guard_run_async,
            runs.guard_node_run,
            usage.count_model_request,
        )
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)
        plugin.switch.active = True

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.google_adk._plugin import switch

        switch.active = False
        unwrap_all(PATCH_TARGETS)
