"""Guard CrewAI agents: every agent run, tool call and delegation to a coworker is a delegation hop.

Install with ``pip install 'otel-guard[crewai]'`` and run the program under
``opentelemetry-instrument``, or instrument it in code before the agents run::

    from otel_guard.instrumentation.crewai import CrewAIInstrumentor

    CrewAIInstrumentor().instrument()

What is a hop
    * An agent run: ``invoke_agent {role}`` (an agent is its ``role``, whitespace made single spaces).
      ``Agent.execute_task`` (a crew's task, a coworker's delegated task) and ``Agent.kickoff`` are a
      run each, and their async forms (``aexecute_task``, ``kickoff_async``, ``akickoff``). A run
      CrewAI starts again from inside the same run (the retry of a failed task, a resumed
      checkpoint) is the same hop.
    * A tool call the model makes: ``execute_tool {tool}``, under the name the model calls it by
      (CrewAI's sanitized name), for native function calls (parallel ones are sibling hops) and the
      text "Action:" format alike. Calls of tools the agent does not have are not hops.
    * A delegation: a call of "Delegate work to coworker" or "Ask question to coworker" (any
      ``BaseAgentTool``) is one hop ``invoke_agent {coworker role}``, and the coworker's run is that
      same hop; so a delegation back to an agent on the path (A delegates to B, B back to A) is a
      cycle, refused before CrewAI tries to run the agent again. A delegation to a coworker the tool
      cannot find is a tool hop, and the tool answers with CrewAI's error.
    * A tool that runs an agent (``agent.kickoff()`` in its body) is a hop for the tool, then one for
      the agent; a tool named exactly like the agent's role is one hop.

What a refusal looks like
    A refused tool call or delegation never runs: CrewAI's ``before_tool_call`` hook blocks it and
    the ``after_tool_call`` hook puts the refusal's text (reason, path, "do not call it again") in
    place of CrewAI's "Tool execution blocked by hook", as the tool result the model reads. A tool
    whose body ran an agent that was refused has CrewAI's own error text ("Error executing tool:
    ...") replaced by the same text. The run goes on and the model answers with what it has. A
    refused run outside any tool raises :class:`~otel_guard.DelegationRefused` from ``kickoff`` /
    ``execute_task`` (and from ``Crew.kickoff``), before the executor is built.

Spans
    One span per hop with the contract's attributes, in the application's tracer provider. CrewAI's
    own telemetry and tracing use providers of their own (and send to CrewAI's servers unless
    ``CREWAI_DISABLE_TELEMETRY=true`` / ``CREWAI_TRACING_ENABLED=false``): they neither see nor carry
    these spans. Chains stay in the process; CrewAI copies the context into the threads it runs
    executors and tools in, so each branch keeps its own chain.

Model requests and tokens
    With ``max_model_requests`` or ``max_tokens`` on, CrewAI's ``before_llm_call`` /
    ``after_llm_call`` hooks count each model request and its tokens against the tree; a request the
    tree may not make ends the run with ``TreeBudgetExceeded``, a ``HookAborted`` (see
    :mod:`._usage`).

Situational guidance
    With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent whose tools reach an agent on its own call
    path gets :func:`otel_guard.prompt.guidance_for` at the start of its user turn (see
    :mod:`._guidance`).

Limits
    Hooks are CrewAI's extension points; the runs are patched (``PATCH_TARGETS``) because CrewAI has
    no hook around a whole run. The model-call hooks are registered only once a model budget or the
    guidance is on (see :mod:`._hooks`); copies of them in executors built before
    ``uninstrument()`` do nothing after it. ``LiteAgent``
    (deprecated in CrewAI) and crews themselves are not hops: each task of a crew starts a tree of
    its own unless the crew runs inside a hop (``with otel_guard.delegate("my_crew"):
    crew.kickoff()``). CrewAI's A2A delegation and its MCP tools are tool calls here; the chain does
    not cross to the remote side (CrewAI pins versions of a2a-sdk and mcp that otel-guard's own
    instrumentors of them do not support).
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
)
"""Every (module, attribute) this instrumentor wraps: the agent runs, which no hook surrounds."""

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

        wrappers = (runs.guard_run, runs.guard_run_async, runs.guard_kickoff, runs.guard_run_async)
        for (module, name), wrapper in zip(PATCH_TARGETS, wrappers, strict=True):
            wrap_function_wrapper(module, name, wrapper)
        hooks.register_hooks()

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.crewai import _hooks as hooks

        unwrap_all(PATCH_TARGETS)
        hooks.unregister_all()
