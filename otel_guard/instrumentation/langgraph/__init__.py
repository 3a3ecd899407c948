"""Guard LangGraph: runs of named graphs, tool calls and ``RemoteGraph`` calls are hops.

Switch it on with ``opentelemetry-instrument`` (extra ``langgraph``), or in code:
``LangGraphInstrumentor().instrument()``. A graph left with LangGraph's default name ``"LangGraph"`` is
no agent and makes no hop; a hop's span starts with LangChain's run of the call, under a LangChain
tracer's span of it (:mod:`._wrappers`). What is a hop, what the model sees, what is left out:
docs/runtimes/langgraph.md.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.langgraph.package import _instruments

_PREGEL: Final = "langgraph.pregel.main"
_REMOTE: Final = "langgraph.pregel.remote"
_TOOLS: Final = "langchain_core.tools.base"
_CALLBACKS: Final = "langchain_core.callbacks.manager"

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = (
    (_PREGEL, "Pregel.stream"),
    (_PREGEL, "Pregel.astream"),
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


class LangGraphInstrumentor(GuardInstrumentor):
    """Makes LangGraph graph runs, tool calls and remote graph calls guarded hops."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        from wrapt import wrap_function_wrapper

        from otel_guard.instrumentation.langgraph import _usage as usage
        from otel_guard.instrumentation.langgraph import _wrappers as wrappers

        patches = (
            wrappers.graph_stream,
            wrappers.graph_astream,
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
        for (module, name), wrapper in zip(PATCH_TARGETS, patches, strict=True):
            wrap_function_wrapper(module, name, wrapper)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap_all(PATCH_TARGETS)
