"""Guard CrewAI: agent runs, tool calls and delegations to a coworker are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``crewai``), or in code before the agents run:
``CrewAIInstrumentor().instrument()``. Tool calls go through CrewAI's own tool-call hooks
(:mod:`._hooks`); the agent runs are patched, because no hook surrounds a whole run. An agent is its
``role``. What is a hop, what the model sees, what is left out: docs/runtimes/crewai.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.crewai.package import _instruments

_AGENT: Final = "crewai.agent.core"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    (_AGENT, "Agent.execute_task"),
    (_AGENT, "Agent.aexecute_task"),
    (_AGENT, "Agent.kickoff"),
    (_AGENT, "Agent.kickoff_async"),  # akickoff, and kickoff inside an event loop, go through it
    ("crewai.hooks.dispatch", "_emit_telemetry"),  # no event for a dispatch of the guard's alone
)
"""Every (module, attribute) this instrumentor wraps: the agent runs, which no hook surrounds, and
the event CrewAI emits after the hooks of a tool call (see :mod:`._hooks`)."""

INTERNAL_NAMES: Final[tuple[PatchTarget, ...]] = (
    ("crewai.hooks.dispatch", "get_global_hook_list"),
    ("crewai.hooks.dispatch", "register"),
    ("crewai.hooks.dispatch", "unregister"),
    ("crewai.tools.agent_tools.base_agent_tools", "BaseAgentTool.sanitize_agent_name"),
    ("crewai.utilities.string_utils", "sanitize_tool_name"),
    ("crewai.llms.base_llm", "BaseLLM.get_token_usage_summary"),
    # The lists of model-call hooks an executor copies when it is built (see _hooks).
    ("crewai.agents.agent_executor", "AgentExecutor"),
)
"""CrewAI names this instrumentor calls or reads without patching them (besides the public hooks)."""


class CrewAIInstrumentor(GuardInstrumentor):
    """Makes CrewAI agent runs, tool calls and delegations guarded hops (see the module docstring)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        # Importing the runtime here, not at module level, keeps this module importable without it.
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.crewai import _hooks as hooks
        from otel_guard.instrumentation.crewai import _runs as runs

        wrappers = (
            runs.guard_run,
            runs.guard_run_async,
            runs.guard_kickoff,
            runs.guard_run_async,
            hooks.quiet_dispatch,
        )
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)
        hooks.register_hooks()

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.crewai import _hooks as hooks

        unwrap_all(PATCH_TARGETS)
        hooks.unregister_all()
