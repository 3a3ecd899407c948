"""Guard Haystack: ``Agent`` runs, tool calls and agents or pipelines called as tools are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``haystack``), or in code:
``HaystackInstrumentor().instrument()``. An ``Agent`` offered as a tool (``AgentTool``, or a
``ComponentTool`` around an ``Agent``) is one hop into that agent, named as the tool; a refused call
reaches the calling model as Haystack's own tool error (``ToolInvocationError``, an error tool
result) with the refusal's text, and the run goes on. What is a hop, what the model sees, what is
left out: docs/runtimes/haystack.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.haystack.package import _instruments

_AGENT: Final = "haystack.components.agents.agent"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Every run of every Agent: called directly, in a pipeline, or by a tool that wraps it.
    (_AGENT, "Agent.run"),
    (_AGENT, "Agent.run_async"),
    # Every tool call an Agent makes (its ToolInvoker steps call these in worker threads or tasks).
    ("haystack.tools.tool", "Tool.invoke"),
    ("haystack.tools.tool", "Tool.invoke_async"),
    # Where the Agent runs its hooks, as named in its module: before its first model request
    # (``before_run``: the guidance) and before each one (``before_llm``: the tree's budgets).
    (_AGENT, "_run_hooks"),
    (_AGENT, "_run_hooks_async"),
    # Where the Agent adds up each response's ``meta["usage"]``: the tree's tokens.
    (_AGENT, "_record_llm_usage"),
)
"""Every (module, attribute) this instrumentor wraps: Haystack's hooks are the Agent's own
constructor argument (and serialized with it), so the guard wraps where they are run instead."""


class HaystackInstrumentor(GuardInstrumentor):
    """Makes Haystack Agent runs, tool calls and agents as tools guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.haystack import _runs, _steps, _tools

        wrappers = (
            _runs.guard_run,
            _runs.guard_run_async,
            _tools.guard_invoke,
            _tools.guard_invoke_async,
            _steps.before_step,
            _steps.before_step_async,
            _steps.count_tokens,
        )
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)
