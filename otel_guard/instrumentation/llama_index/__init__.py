"""Guard LlamaIndex: agent runs, tool calls, agents run by tools and ``AgentWorkflow`` handoffs are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``llama-index``), or in code:
``LlamaIndexInstrumentor().instrument()``. Runs and tool calls are patched (``run()`` and the agents'
``_call_tool``): LlamaIndex's instrumentation dispatcher ignores what its handlers raise, so it cannot
refuse a call; a span handler on it ends each run's hop with LlamaIndex's own span of the run. What is
a hop, what the model sees, what is left out: docs/runtimes.md, "LlamaIndex".
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.llama_index.package import _instruments

_AGENT: Final = "llama_index.core.agent.workflow.base_agent"
_WORKFLOW: Final = "llama_index.core.agent.workflow.multi_agent_workflow"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Where a run starts: FunctionAgent, ReActAgent, CodeActAgent (every BaseWorkflowAgent) ...
    (_AGENT, "BaseWorkflowAgent.run"),
    # ... and a multi-agent AgentWorkflow, whose agents take turns inside one run.
    (_WORKFLOW, "AgentWorkflow.run"),
    # Where each tool call the model asks for is made, and its exception becomes a failed ToolOutput.
    (_AGENT, "BaseWorkflowAgent._call_tool"),
    (_WORKFLOW, "AgentWorkflow._call_tool"),
)
"""Every (module, attribute) this instrumentor patches."""


class LlamaIndexInstrumentor(GuardInstrumentor):
    """Makes LlamaIndex agent runs, tool calls and handoffs guarded hops (see the module docstring)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.llama_index._runs import guard_run, run_ends
        from otel_guard.instrumentation.llama_index._tools import guard_tool_call

        wrappers = (guard_run, guard_run, guard_tool_call, guard_tool_call)
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)
        run_ends.stay(True)

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.llama_index._runs import run_ends

        unwrap_all(PATCH_TARGETS)
        run_ends.stay(False)  # once the runs it has seen start have ended
