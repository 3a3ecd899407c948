"""Tool calls as hops, through CrewAI's own tool-call hooks.

CrewAI runs every tool call the model makes (native function calling, one call or parallel ones, and
the text "Action:" format) between two hooks: ``before_tool_call`` can block the call, and
``after_tool_call``, which runs on a blocked call too, can replace the result the model reads.

* The before hook is the hop's check. An allowed call's hop starts there and its context is attached
  for the tool's body, so the agents a tool runs extend the chain; a refused call is blocked, and its
  body never runs.
* The after hook ends the hop. For a refused call it replaces CrewAI's "Tool execution blocked by
  hook" with the refusal's text, so the model reads why and that retrying will not help. A tool
  whose body ran an agent that was refused raised the refusal, which CrewAI reports to the model as
  its own error text around the refusal's message ("Error executing tool: ..."); that text is
  replaced by the refusal's full text too. A tool that caught the refusal and returned its own
  result keeps it.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.errors import DelegationRefused
from otel_guard.guard import delegate
from otel_guard.instrumentation._base import refusal_text
from otel_guard.instrumentation.crewai._names import tool_call_hop
from otel_guard.instrumentation.crewai._scope import ToolCall, current_call, enter_call, leave_call
from otel_guard.instrumentation.crewai._usage import count_tokens


def before_tool_call(hook: Any) -> bool | None:
    """CrewAI's ``before_tool_call`` hook: check the call as a hop; ``False`` blocks a refused one."""
    if not is_instrumentation_enabled():
        return None
    found = tool_call_hop(hook.tool_name, hook.tool, hook.tool_input)
    if found is None:
        return None
    name, kind = found
    # The response that asked for this call has no after hook of its own: its tokens count now,
    # before the hop is checked against the tree's budgets.
    count_tokens(getattr(hook.agent, "llm", None))
    hop = delegate(name, kind=kind)
    try:
        hop_context = hop.start()
    except DelegationRefused as err:
        enter_call(ToolCall(hook.tool_input, None, err), None)
        return False
    enter_call(ToolCall(hook.tool_input, hop), name, hop_context)
    return None


def after_tool_call(hook: Any) -> str | None:
    """CrewAI's ``after_tool_call`` hook: end the call's hop; the refusal's text for a refused call."""
    call = current_call()
    if call is None or call.tool_input is not hook.tool_input:
        return None  # not a call the before hook made a hop of (unknown tool, suppressed)
    leave_call(call)
    refusal = call.refusal
    # Refused here, or CrewAI reports the refusal raised in the body as the call's error; a body that
    # caught the refusal of an agent it ran and answered itself keeps its answer.
    if refusal is not None and (call.hop is None or str(refusal) in str(hook.tool_result or "")):
        if call.hop is not None:
            call.hop.finish(refusal)
        return refusal_text(refusal)
    if call.hop is not None:
        call.hop.finish()
    return None
