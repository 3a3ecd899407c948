"""Guard LlamaIndex: agent runs, tool calls, agents run by tools and ``AgentWorkflow`` handoffs are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``llama-index``), or in code:
``LlamaIndexInstrumentor().instrument()``. Runs, tool calls and agent steps are patched (``run()``,
the agents' ``_call_tool`` and ``take_step``): LlamaIndex's instrumentation dispatcher ignores what
its handlers raise, so it cannot refuse a call; a span handler on it ends each run's hop with
LlamaIndex's own span of the run. What is a hop, what the model sees, what is left out:
docs/runtimes.md, "LlamaIndex".
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget
from otel_guard.instrumentation.llama_index.package import _instruments

_PACKAGE: Final = "llama_index.core.agent.workflow"
_AGENT: Final = f"{_PACKAGE}.base_agent"
_WORKFLOW: Final = f"{_PACKAGE}.multi_agent_workflow"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Where a run starts: FunctionAgent, ReActAgent, CodeActAgent (every BaseWorkflowAgent) ...
    (_AGENT, "BaseWorkflowAgent.run"),
    # ... and a multi-agent AgentWorkflow, whose agents take turns inside one run.
    (_WORKFLOW, "AgentWorkflow.run"),
    # Where each tool call the model asks for is made, and its exception becomes a failed ToolOutput.
    (_AGENT, "BaseWorkflowAgent._call_tool"),
    (_WORKFLOW, "AgentWorkflow._call_tool"),
    # Each agent step: one model request, counted against the tree while a model budget is on.
    (f"{_PACKAGE}.function_agent", "FunctionAgent.take_step"),
    (f"{_PACKAGE}.react_agent", "ReActAgent.take_step"),
    (f"{_PACKAGE}.codeact_agent", "CodeActAgent.take_step"),
)
"""Every (module, attribute) this instrumentor patches."""


class LlamaIndexInstrumentor(GuardInstrumentor):
    """Makes LlamaIndex agent runs, tool calls and handoffs guarded hops (see the module docstring)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        from otel_guard.instrumentation._replacements import guard_method
        from otel_guard.instrumentation.llama_index._runs import guard_run, run_ends
        from otel_guard.instrumentation.llama_index._tools import guard_tool_call
        from otel_guard.instrumentation.llama_index._usage import guard_model_request

        step = guard_model_request
        wrappers = (guard_run, guard_run, guard_tool_call, guard_tool_call, step, step, step)
        for target, wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            guard_method(target, wrapper)
        run_ends.stay(True)

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation._replacements import restore
        from otel_guard.instrumentation.llama_index._runs import run_ends

        for target in PATCH_TARGETS:
            restore(target)
        run_ends.stay(False)  # once the runs it has seen start have ended
