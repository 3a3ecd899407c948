"""Guard LangGraph agents with no code change.

Install ``pip install 'otel-guard[langgraph]'`` and run the program as usual under
``opentelemetry-instrument python app.py``, or instrument it yourself::

    from otel_guard.instrumentation.langgraph import LangGraphInstrumentor

    LangGraphInstrumentor().instrument()

From then on:

* every run of a named graph (``graph.invoke`` / ``ainvoke`` / ``stream`` / ``astream``; a graph
  made with ``StateGraph(...).compile(name="planner")`` or ``create_react_agent(..., name=...)``) is a
  hop ``invoke_agent planner``. ``invoke`` runs through ``stream``: one run is one hop. A graph left
  with LangGraph's default name ``"LangGraph"`` is not taken for an agent and makes no hop;
* every tool call (``BaseTool.run`` / ``arun``: what ``ToolNode`` and the prebuilt agents run) is a
  hop ``execute_tool {tool}``. A tool that runs a graph of its own name (an agent offered as a tool)
  is one hop, not two;
* a ``RemoteGraph`` run is a client hop whose HTTP request carries the chain (W3C ``baggage``) and
  ``traceparent`` to the LangGraph server; a graph on the server whose arriving chain already ends
  with its name checks that hop again instead of adding it twice.

A hop is decided before its call begins, and its span starts when LangChain's run of the call begins
(``CallbackManager.on_tool_start`` / ``on_chain_start``): under the span a LangChain tracer made of that
run (OpenInference's, Traceloop's), so the trace is one tree with them.

With ``max_model_requests`` or ``max_tokens`` on, every model call is checked against its tree before
LangChain's callbacks start its run, and its tokens are counted when it ends (see
:mod:`._usage`); a request the tree may not make raises ``TreeBudgetExceeded``, a
``GraphRecursionError``.

A refused hop never runs. When a model asked for it, the tool call returns a ``ToolMessage`` with
``status="error"`` whose text gives the reason, the path and that retrying will not help, so the graph
goes on and the model answers with what it has. A graph run refused outside any tool (for example a
request from another process whose chain already holds this graph) raises
:class:`~otel_guard.DelegationRefused` to its caller.

Settings are the ``OTEL_GUARD_*`` environment variables (or :func:`otel_guard.configure`).
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
