"""Guard smolagents: agent runs, tool calls and managed-agent calls are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``smolagents``), or in code:
``SmolagentsInstrumentor().instrument()``. A managed agent called by its manager is one hop into it;
a refused call reaches the calling model as the step's tool error, with the refusal's text, and the
run goes on. ``ToolCallingAgent`` and ``CodeAgent`` alike. What is a hop, what the model sees, what
is left out: docs/runtimes.md, "smolagents".
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.smolagents._scope import switch_on
from otel_guard.instrumentation.smolagents.package import _instruments

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Every run of every agent: run(), a managed agent's __call__, stream=True alike.
    ("smolagents.agents", "MultiStepAgent.run"),
    # Every tool call: a ToolCallingAgent's, and the calls a CodeAgent's code makes.
    ("smolagents.tools", "Tool.__call__"),
    # Where the local executor starts the thread a CodeAgent's code runs in: the run's context goes along.
    ("smolagents.local_python_executor", "timeout"),
)
"""Every (module, attribute) this instrumentor wraps: smolagents has no hook before a run or a tool call."""


class SmolagentsInstrumentor(GuardInstrumentor):
    """Makes smolagents agent runs, tool calls and managed-agent calls guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.smolagents import _runs, _tools

        wrappers = (_runs.guard_run, _tools.guard_tool_call, _tools.carry_context)
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)
        switch_on(True)

    def _uninstrument(self, **kwargs: Any) -> None:
        # The step callbacks agents were given stay (smolagents cannot remove one): they do nothing now.
        switch_on(False)
        unwrap_all(PATCH_TARGETS)
