"""The guard as an ADK plugin: tool calls and transfers are hops; guidance and token counts per request.

ADK's extension point for everything a runner runs is a ``BasePlugin`` on the runner. The instrumentor
puts one :class:`GuardPlugin` first on every ``Runner`` as it is made (:func:`add_guard_plugin`):
``InMemoryRunner`` and the runners ADK makes itself (an ``AgentTool``'s, an A2A server's) included. A
runner made with the parent's plugins (an ``AgentTool`` shares them) already holds it and gets no second.
First, because ADK stops at the first plugin that answers a callback: no plugin ahead of the guard can
answer a call the guard would refuse, nor skip the callback that ends a hop.

* ``before_tool_callback``: the call's hop (see :mod:`._tools`) is decided and started, and
  its context attached for the tool's body; ``after_tool_callback`` / ``on_tool_error_callback`` (ADK
  calls one of them for every call whose before-callbacks returned, a cancelled one included) end it.
  A refused call returns ``{"error": <refusal>}``: ADK skips the tool and hands the model that function
  response. A refusal raised inside the tool's body (the tool started an agent run, or called a guarded
  client, that was refused; or the tree's budget refused a model request in the agent run an
  ``AgentTool`` started) becomes the same error response in ``on_tool_error_callback``.
* ``transfer_to_agent`` and a single-turn sub-agent's call: the hop into the agent is decided in
  ``before_tool_callback``, in the calling agent's context; refused, the call never runs (no transfer
  happens) and the model reads why. Allowed, the hop is handed over to the agent's run
  (:mod:`._calls`). Any other tool that asks for a transfer
  (``tool_context.actions.transfer_to_agent``) gets the same decision after it ran; refused, the
  transfer is withdrawn and the tool's response is the refusal. A transfer's hop is of kind transfer
  (ADK's ``EventActions.transfer_to_agent`` passes control: a transfer back to the parent or root
  agent is no cycle); a sub-agent's call, single-turn or task, is a call (its caller waits).
* ``before_model_callback``: the situational guidance (:mod:`._guidance`).
  ``after_model_callback``: the task delegations the response asks for are decided (ADK dispatches
  them without calling the tool callbacks) and handed over, refused ones as refusals; the response's
  tokens are counted against the tree's ``max_tokens``.
* ``after_run_callback`` / ``on_run_error_callback``: whatever hop the invocation left open is ended.

Agent runs are not the plugin's (see :mod:`._runs` for why). After ``uninstrument()`` the
plugins left on existing runners make no more hops; they still end the ones they opened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from google.adk.plugins.base_plugin import BasePlugin
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_behind
from otel_guard.instrumentation.google_adk._calls import ToolCall, calls, in_hop
from otel_guard.instrumentation.google_adk._contexts import actions_of, calling_agent
from otel_guard.instrumentation.google_adk._guidance import add_guidance
from otel_guard.instrumentation.google_adk._remote import hopped_by_a2a
from otel_guard.instrumentation.google_adk._runs import conversation
from otel_guard.instrumentation.google_adk._tools import (
    HandOver,
    hop_of,
    is_transfer,
    refusal_response,
    task_agents,
    task_calls,
)
from otel_guard.instrumentation.google_adk._usage import TreeBudgetExceeded, model_name, model_usage
from otel_guard.settings import current_settings
from otel_guard.usage import aafter_model_request, model_requests_counted

if TYPE_CHECKING:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext


class Switch:
    """Whether the instrumentation is on (plugins stay on the runners made while it was)."""

    active = False


switch = Switch()


def _guarding() -> bool:
    return switch.active and is_instrumentation_enabled()


class GuardPlugin(BasePlugin):  # type: ignore[misc, unused-ignore]  # BasePlugin is Any without ADK
    """otel-guard's plugin: see the module docstring."""

    NAME = "otel_guard"

    def __init__(self) -> None:
        super().__init__(name=self.NAME)

    # -- tool calls and transfers ---------------------------------------------------------------

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        if not _guarding():
            return None
        planned = hop_of(tool, tool_args)
        if planned is None:
            return None
        if isinstance(planned, HandOver):
            return await _hand_over(planned.agent, tool_context, transfer=planned.transfer)
        hop = delegate(planned.name, kind=planned.kind)
        try:
            hop_context = await hop.astart()
        except DelegationRefused as err:
            return refusal_response(err)
        token = otel_context.attach(in_hop(hop_context, hop))
        calls.opened(tool_context, ToolCall(hop, token, tool_context.invocation_id))
        return None

    async def after_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, result: dict[str, Any]
    ) -> dict[str, Any] | None:
        call = calls.closing(tool_context)
        if call is not None:
            call.close(None)
        actions = actions_of(tool_context)
        target = actions.transfer_to_agent
        if not isinstance(target, str) or not target or is_transfer(tool) or not _guarding():
            return None
        # A tool of its own that asked for a transfer: decided now, in the agent's context again.
        refused = await _hand_over(target, tool_context, transfer=True)
        if refused is not None:
            actions.transfer_to_agent = None
        return refused

    async def on_tool_error_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext, error: Exception
    ) -> dict[str, Any] | None:
        call = calls.closing(tool_context)
        if call is not None:
            call.close(error)
        refusal = refusal_behind(error)
        if refusal is None and isinstance(error, TreeBudgetExceeded) and _guarding():
            # The tree's budget refused a request in the tool's own agent run (an AgentTool): the
            # calling model reads why, as it does a refused hop; its next request ends the root run.
            return {"error": str(error)}
        if refusal is None or not _guarding():
            return None
        return refusal_response(refusal)

    # -- model requests -------------------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        if current_settings().situational_prompt and _guarding():
            add_guidance(callback_context.agent_name, llm_request)
        return None

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        if llm_response.partial:
            return None  # a streamed response's chunks: the complete response follows
        parts = llm_response.content.parts if llm_response.content is not None else None
        if parts and switch.active and any(part.function_call is not None for part in parts):
            # Most agents have no task agents: then no call of the response is a delegation.
            tasks = task_agents(calling_agent(callback_context))
            if tasks and is_instrumentation_enabled():
                await _hand_over_tasks(callback_context, task_calls(tasks, parts))
        if switch.active and model_requests_counted():
            model = model_name(llm_response.model_version, callback_context)
            await aafter_model_request(model_usage(llm_response.usage_metadata, model))
        return None

    # -- the end of an invocation ---------------------------------------------------------------

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        calls.end_invocation(invocation_context.invocation_id, None)

    async def on_run_error_callback(self, *, invocation_context: InvocationContext, error: Exception) -> None:
        calls.end_invocation(invocation_context.invocation_id, error)


async def _hand_over(agent: str, tool_context: ToolContext, *, transfer: bool) -> dict[str, Any] | None:
    """Decide the hop into ``agent``, which the call hands control to (for good: a ``transfer``): the
    refusal response, or ``None`` (the hop is handed over to the agent's run)."""
    caller = calling_agent(tool_context)
    root = getattr(caller, "root_agent", None)
    if hopped_by_a2a(root.find_agent(agent) if root is not None else None):
        return None  # the remote agent's A2A send decides
    hop = delegate(agent, attributes=conversation(tool_context), transfer=transfer)
    try:
        await hop.adecide()  # a budget store is awaited, never the event loop held
    except DelegationRefused as err:
        return refusal_response(err)
    calls.hand_over(tool_context.invocation_id, agent, hop)
    return None


async def _hand_over_tasks(callback_context: CallbackContext, delegated: list[Any]) -> None:
    """Decide the task delegations a model response asks for (``delegated``, in order), in the
    delegating agent's context.

    ADK dispatches them itself, whatever the guard says; a refused one is handed over as a refusal,
    and the task agent's run answers with it instead of running (see :mod:`._runs`).
    """
    invocation_id = callback_context.invocation_id
    for task_agent in delegated:
        hop = delegate(task_agent.name, attributes=conversation(callback_context))
        try:
            await hop.adecide()
        except DelegationRefused as err:
            calls.hand_over(invocation_id, task_agent.name, err)
        else:
            calls.hand_over(invocation_id, task_agent.name, hop)


def add_guard_plugin(
    wrapped: Callable[..., None], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """``Runner.__init__``: the runner, with the guard's plugin first among its plugins."""
    wrapped(*args, **kwargs)
    plugins: list[Any] = instance.plugin_manager.plugins
    if not any(isinstance(plugin, GuardPlugin) for plugin in plugins):
        plugins.insert(0, GuardPlugin())
