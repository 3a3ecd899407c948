"""Guard Agno: agent and team runs, tool calls and team delegations are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``agno``), or in code:
``AgnoInstrumentor().instrument()``. A team member run by its leader is a hop into the member (a
transfer where the team hands control over: route mode); a refused call reaches the model as the tool
call's error result, with the refusal's text, and the run goes on. What is a hop, what the model
sees, what is left out: docs/runtimes/agno.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.agno.package import _instruments

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Every run of every agent and team, streamed or not.
    ("agno.agent.agent", "Agent.run"),
    ("agno.agent.agent", "Agent.arun"),
    ("agno.team.team", "Team.run"),
    ("agno.team.team", "Team.arun"),
    # Every tool call a model makes: the leader's delegation tools included.
    ("agno.tools.function", "FunctionCall.execute"),
    ("agno.tools.function", "FunctionCall.aexecute"),
    # Every model request, counted for the tree's budgets.
    ("agno.models.base", "Model._invoke_with_retry"),
    ("agno.models.base", "Model._ainvoke_with_retry"),
    ("agno.models.base", "Model._invoke_stream_with_retry"),
    ("agno.models.base", "Model._ainvoke_stream_with_retry"),
)
"""Every (module, attribute) this instrumentor wraps: Agno's tool hooks are given per agent and per
tool, and its pre-hooks cannot make a run's context, so the calls are wrapped."""


class AgnoInstrumentor(GuardInstrumentor):
    """Makes Agno agent and team runs, tool calls and team delegations guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.agno import _runs, _tools, _usage

        wrappers = (
            _runs.guard_run,
            _runs.guard_arun,
            _runs.guard_run,
            _runs.guard_arun,
            _tools.guard_execute,
            _tools.guard_aexecute,
            _usage.count_request,
            _usage.count_arequest,
            _usage.count_stream,
            _usage.count_astream,
        )
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)
