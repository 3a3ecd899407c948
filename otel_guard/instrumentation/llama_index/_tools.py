"""Tool calls and handoffs as hops: the agents' ``_call_tool``, where LlamaIndex calls a tool for the model.

Every tool call an agent's model asks for (``FunctionAgent``, ``ReActAgent``, an agent of an
``AgentWorkflow``) goes through ``_call_tool(ctx, tool, tool_input)``, which turns the tool's
exception into a failed ``ToolOutput`` (``is_error=True``, the exception's text as its content): what
the model then reads. There (patched: the dispatcher cannot refuse or change a result):

* a call is a hop ``execute_tool {tool}``; a run of the agent of the same name inside it joins it,
  and a run of another agent directly in its body takes the tool's place in the chain (:mod:`._runs`);
* an ``AgentWorkflow``'s ``handoff`` call to one of its agents is a hop ``invoke_agent {to_agent}``
  of kind transfer: LlamaIndex's handoff tool hands "control of that chat" to that agent, and the
  agent handing off waits for nothing. Taken (LlamaIndex set ``next_agent``), the hop stays open
  until the run ends, and the agent it put in charge makes its calls in it
  (:attr:`~._scope.Run.in_charge`): so handing back to an agent that handed off is no cycle (write →
  review → write), and a ping-pong of handoffs grows one chain until ``max_name_depth`` or
  ``max_depth`` refuses it. Not taken (LlamaIndex's own checks said no), it ends at once;
* a refused call never runs: it gives the failed ``ToolOutput`` a failing tool gives, with
  :func:`refusal_text`, and the model reads that and answers. A call whose tool body raised a
  refusal (its sub-agent's run was refused) gives the same text in place of the bare message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from llama_index.core.agent.workflow import AgentWorkflow
from llama_index.core.tools import ToolOutput
from opentelemetry import baggage
from opentelemetry import context as otel_context

from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_behind, refusal_text, unless_suppressed
from otel_guard.instrumentation.llama_index._scope import CALL, RUN, Call, Run
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

HANDOFF: Final = "handoff"
"""The name of the tool ``AgentWorkflow`` gives its agents to hand off (a name agents may not use)."""


@unless_suppressed
async def guard_tool_call(
    wrapped: Callable[..., Awaitable[ToolOutput]],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> ToolOutput:
    """``BaseWorkflowAgent._call_tool`` and ``AgentWorkflow._call_tool``: the call is a hop."""
    ctx, tool, tool_input = _arguments(*args, **kwargs)
    name = tool.metadata.get_name()
    run = otel_context.get_value(RUN)
    run = run if isinstance(run, Run) else None
    target = _handoff_target(instance, name, tool_input)
    hop = delegate(name, kind="tool") if target is None else delegate(target, transfer=True)
    base = run.in_charge if run is not None else None
    token = otel_context.attach(base) if base is not None else None
    caller_chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY)
    try:
        hop_ctx = await hop.astart()
    except DelegationRefused as err:
        return refused_output(name, tool_input, err)
    finally:
        if token is not None:
            otel_context.detach(token)
    if target is None:
        hop_ctx = otel_context.set_value(CALL, Call(name, hop, caller_chain), hop_ctx)
    token = otel_context.attach(hop_ctx)
    try:
        output = await wrapped(*args, **kwargs)
    except BaseException as exc:  # only what LlamaIndex lets through (a workflow waiting for an event)
        otel_context.detach(token)
        hop.finish(exc)
        raise
    otel_context.detach(token)
    inner = refusal_behind(output.exception)
    if inner is not None:
        output = refused_output(name, tool_input, inner)
    if target is not None and run is not None and await _taken(ctx, target):
        run.hand_off(hop)
    else:
        hop.finish(output.exception)
    return output


def refused_output(name: str, tool_input: Any, err: DelegationRefused) -> ToolOutput:
    """A refused call as LlamaIndex reports a failed tool to the model, with the refusal's text."""
    text = refusal_text(err)
    raw_input = tool_input if isinstance(tool_input, dict) else {}
    return ToolOutput(
        content=text, tool_name=name, raw_input=raw_input, raw_output=text, is_error=True, exception=err
    )


def _arguments(ctx: Any, tool: Any, tool_input: Any) -> tuple[Any, Any, Any]:
    return ctx, tool, tool_input


def _handoff_target(workflow: Any, name: str, tool_input: Any) -> str | None:
    """The agent a handoff call hands off to, when it is one of the workflow's agents."""
    if name != HANDOFF or not isinstance(workflow, AgentWorkflow) or not isinstance(tool_input, dict):
        return None
    target = tool_input.get("to_agent")
    return target if isinstance(target, str) and target in workflow.agents else None


async def _taken(ctx: Any, target: str) -> bool:
    """Whether the handoff call made ``target`` the next agent (LlamaIndex checks it may hand off)."""
    return bool(await ctx.store.get("next_agent", default=None) == target)
