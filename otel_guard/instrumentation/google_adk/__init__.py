"""Guard Google ADK (Agent Development Kit) agents: runs, tool calls, agents as tools, transfers.

Install with ``pip install 'otel-guard[google-adk]'`` and run the program under
``opentelemetry-instrument``, or instrument it in code before the runners are made::

    from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor

    GoogleADKInstrumentor().instrument()

What is a hop
    * An agent run: ``invoke_agent {agent.name}``, for every agent a runner runs (the root agent,
      sub-agents, workflow agents, the agent of an ``AgentTool``), from the run's first event to its
      last (:mod:`._runs`).
    * A tool call: ``execute_tool {tool.name}``, around the tool's body. An ``AgentTool`` (an agent
      called as a tool) is one hop ``invoke_agent {agent.name}``: the agent's run inside it joins the
      call's hop, as does the run of any agent named like the hop in force (a tool of the agent's
      name, an A2A server's hop), so one call is one hop: the same name twice would be a false cycle.
    * A call that hands control to an agent ADK runs elsewhere, ``invoke_agent {agent}``: a transfer
      (``transfer_to_agent``, or any tool that sets ``actions.transfer_to_agent``), a
      ``mode="single_turn"`` sub-agent called as a tool, a ``mode="task"`` sub-agent given a task. The
      hop is decided when the model asks for it, in the calling agent's context, and opened when the
      agent's run starts (ADK 2 runs a transfer's target after the transferring run has ended, and a
      sub-agent in a context captured before the call), so the chain reaches the agent, and a bounce
      back to an agent on the path is a cycle (:mod:`._calls`).
    * A remote agent (``RemoteA2aAgent``): with otel-guard's A2A instrumentation on, the A2A send is the
      hop (``invoke_agent {card name}``, CLIENT); it carries the chain to the server, where the hop is
      checked again and the served ADK agent's run joins it (:mod:`._remote`).

What a refusal looks like
    The refused call never runs: its function response is ``{"error": "Refused by otel-guard
    (a2a_delegation_cycle, reason: cycle): ... do not call it again ..."}``, the form ADK reports a
    call it could not make to the model in (a tool the model made up), so the model reads why and
    answers with what it has, and the run goes on. A refused transfer never happens: the current
    agent stays in charge. A refused task delegation is answered the same way (the task agent never
    runs). A refusal raised inside a tool's body (an agent run the tool started, a guarded client
    call) becomes that tool's error response too. An agent run refused outside any tool raises
    :class:`~otel_guard.DelegationRefused` from the runner before its model is called. A remote
    agent refused by its A2A send answers as ADK answers for any failed remote call, with an error
    event (``A2A request failed: Delegation cycle ...``), which an ``AgentTool`` hands the model as
    its result.

Spans
    ADK traces its own runs, tool calls and model calls with the global tracer provider. An agent
    hop's span is the parent of ADK's ``invoke_agent`` span of the run; a tool hop's span is the
    child of ADK's ``execute_tool`` span of the call (ADK opens it before the plugin's callback); a
    handed-over hop's span is the child of ADK's span where it was asked for (the ``execute_tool``
    span of a transfer or single-turn call, the delegating agent's span for a task). One trace; only
    the hop spans carry ``otel_guard.*``.

Model requests and tokens
    With ``max_model_requests`` or ``max_tokens`` on, each model request is counted where ADK counts
    its own (``InvocationContext.increment_llm_call_count``, which enforces ``max_llm_calls``), and one
    the tree may not make ends the run with :class:`._usage.TreeBudgetExceeded`, a
    ``LlmCallsLimitExceededError``; each complete response's tokens are counted after it.

Situational guidance
    With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent whose tools (or transfer targets) include an
    agent on its call path gets :func:`otel_guard.prompt.guidance_for` at the start of its newest user
    message, never in its instructions (:mod:`._guidance`).

How
    The guard's ADK plugin (:mod:`._plugin`), ADK's own extension point, is put first on
    every ``Runner`` as it is made (``InMemoryRunner`` and the runners ADK makes for an ``AgentTool``
    or an A2A server included): it makes the tool hops, decides the hand-overs, adds guidance and
    counts tokens. What a plugin cannot do is patched, and only that: the runner's construction (to
    add the plugin), the agent run's event stream (ADK skips ``after_agent_callback`` when it closes a
    run early, as it does on every transfer), and ADK's model-call counter (a plugin cannot end a run
    with ADK's own limit error). See ``PATCH_TARGETS``.

Limits
    Live runs (``run_live``) are not guarded. Hops are made under a ``Runner`` (the plugin rides on
    it); an agent run without one (calling ``agent.run_async`` by hand) is still a hop, its tools are
    not. See docs/runtimes.md.

Settings are the ``OTEL_GUARD_*`` variables or :func:`otel_guard.configure`;
``instrument(tracer_provider=..., meter_provider=...)`` sends otel-guard's spans and metrics to those
providers (process-wide, for every instrumentor). Tested with ``google-adk`` 2.13.
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
