"""Guard LangGraph: runs of named graphs, tool calls and ``RemoteGraph`` calls are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``langgraph``), or in code:
``LangGraphInstrumentor().instrument()``. A graph left with LangGraph's default name ``"LangGraph"`` is
no agent and makes no hop; a hop's span starts with LangChain's run of the call, under a LangChain
tracer's span of it (:mod:`._wrappers`). What is a hop, what the model sees, what is left out:
docs/runtimes/langgraph.md.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, PatchWhenImported, unwrap_all
from otel_guard.instrumentation.langgraph.package import _instruments, _instruments_agents

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage
    from langchain_core.tools import BaseTool

    from otel_guard.instrumentation.langgraph._guidance import GuidanceMiddleware

_log = logging.getLogger("otel_guard.instrumentation")

_PREGEL: Final = "langgraph.pregel.main"
_REMOTE: Final = "langgraph.pregel.remote"
_TOOLS: Final = "langchain_core.tools.base"
_CALLBACKS: Final = "langchain_core.callbacks.manager"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    (_PREGEL, "Pregel.stream"),
    (_PREGEL, "Pregel.astream"),
    (_PREGEL, "Pregel.invoke"),
    (_PREGEL, "Pregel.ainvoke"),
    (_REMOTE, "RemoteGraph.stream"),
    (_REMOTE, "RemoteGraph.astream"),
    (_TOOLS, "BaseTool.run"),
    (_TOOLS, "BaseTool.arun"),
    (_CALLBACKS, "CallbackManager.on_tool_start"),
    (_CALLBACKS, "AsyncCallbackManager.on_tool_start"),
    (_CALLBACKS, "CallbackManager.on_chain_start"),
    (_CALLBACKS, "AsyncCallbackManager.on_chain_start"),
    # A tree's model requests and tokens (max_model_requests, max_tokens)
    (_CALLBACKS, "CallbackManager.on_chat_model_start"),
    (_CALLBACKS, "CallbackManager.on_llm_start"),
    (_CALLBACKS, "AsyncCallbackManager.on_chat_model_start"),
    (_CALLBACKS, "AsyncCallbackManager.on_llm_start"),
    (_CALLBACKS, "CallbackManagerForLLMRun.on_llm_end"),
    (_CALLBACKS, "AsyncCallbackManagerForLLMRun.on_llm_end"),
)
"""Every (module, attribute) this instrumentation patches."""

_AGENTS: Final = "langchain.agents"
AGENT_PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    # Where create_agent is looked up (re-exported, and where it is defined): the guidance middleware
    # is added to every agent built while instrumented. Patched when the app imports langchain.agents,
    # and only with langchain installed (it is optional beside langgraph).
    (_AGENTS, "create_agent"),
    (f"{_AGENTS}.factory", "create_agent"),
)
"""The (module, attribute) patched when LangChain's agents are there (``langchain``, optional)."""


class LangGraphInstrumentor(GuardInstrumentor):
    """Makes LangGraph graph runs, tool calls and remote graph calls guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    @property
    def trigger_modules(self) -> tuple[str, ...]:
        # ``langchain.agents`` imports langchain_core, whose import would patch while langchain.agents
        # is half imported (no create_agent yet): ``langchain``'s own import patches before that.
        triggers = super().trigger_modules
        return (*triggers, "langchain") if importlib.util.find_spec("langchain") is not None else triggers

    def _instrument(self, **kwargs: Any) -> None:
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation._replacements import guard_method
        from otel_guard.instrumentation.langgraph import _usage as usage
        from otel_guard.instrumentation.langgraph import _wrappers as wrappers

        patches = (
            wrappers.graph_stream,
            wrappers.graph_astream,
            wrappers.graph_invoke,
            wrappers.graph_ainvoke,
            wrappers.remote_stream,
            wrappers.remote_astream,
            wrappers.tool_run,
            wrappers.tool_arun,
            wrappers.tool_run_started,
            wrappers.tool_arun_started,
            wrappers.chain_run_started,
            wrappers.chain_arun_started,
            usage.model_run_started,
            usage.model_run_started,
            usage.amodel_run_started,
            usage.amodel_run_started,
            usage.model_run_ended,
            usage.amodel_run_ended,
        )
        for target, wrapper in zip(PATCH_TARGETS, patches, strict=True):
            if target[0] == _CALLBACKS:
                # Read and called at every LangChain run's start (8 a one-tool graph run) and model
                # call: a plain function, bound by CPython as the method it replaces, not a wrapt
                # wrapper (a bound wrapper made at each read).
                guard_method(target, wrapper)
            else:
                wrap_function_wrapper(*target, wrapper)
        if importlib.util.find_spec("langchain") is not None:
            conflict = get_dependency_conflicts(_instruments_agents)
            if conflict is None:
                _agent_patch.apply()
            else:
                _log.debug("otel-guard: create_agent left unpatched: %s", conflict)

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation._replacements import restore

        unwrap_all(target for target in PATCH_TARGETS if target[0] != _CALLBACKS)
        for target in PATCH_TARGETS:
            if target[0] == _CALLBACKS:
                restore(target)
        # Agents built meanwhile keep the middleware (a graph's middleware is fixed): it does nothing now.
        _agent_patch.remove()


# -- create_agent -------------------------------------------------------------------------------


def _guiding() -> bool:
    """Whether the middleware the instrumentor added still guides: instrumented, not suppressed."""
    return _agent_patch.wanted and is_instrumentation_enabled()


def _guide_new_agent(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: Any) -> Any:
    """``create_agent``: the agent gets :class:`GuidanceMiddleware` (while the setting is on)."""
    from otel_guard.instrumentation.langgraph._guidance import with_guidance

    return wrapped(*args, **with_guidance(kwargs, _guiding))


_agent_patch = PatchWhenImported(_AGENTS, *((target, _guide_new_agent) for target in AGENT_PATCH_TARGETS))


# -- guidance by hand -----------------------------------------------------------------------------


def guidance_middleware(agent: str | None = None) -> GuidanceMiddleware:
    """The situational guidance as a ``create_agent`` middleware, for an agent built without the
    instrumentor: ``create_agent(model, tools, name="budget", middleware=[guidance_middleware("budget")])``.

    ``agent`` is the agent the model runs in; without it, the agent of the hop in force. It adds the
    guidance while ``OTEL_GUARD_SITUATIONAL_PROMPT`` is on, instrumented or not.
    """
    from otel_guard.instrumentation.langgraph._guidance import GuidanceMiddleware

    return GuidanceMiddleware(agent)


def guided_messages(
    messages: Sequence[BaseMessage],
    tools: Sequence[BaseTool | Mapping[str, Any]],
    *,
    agent: str | None = None,
) -> list[BaseMessage]:
    """``messages`` for a hand-built graph's model node, with the situational guidance leading the
    newest ``HumanMessage`` when it applies (the setting on, a tool of ``tools`` named after an agent
    on the call path); else a copy of them as they are. ``agent`` as for :func:`guidance_middleware`.
    """
    from otel_guard.instrumentation.langgraph._guidance import guided_messages as guided

    return guided(messages, tools, agent=agent)
