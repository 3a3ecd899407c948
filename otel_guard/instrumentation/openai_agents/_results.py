"""A refusal in the OpenAI Agents SDK's own shapes: a tool result, or a handoff that did not happen.

The model must read a refusal as the output of the call it made, so the run goes on and the model
answers with what it has:

- a refused function tool (or agent-as-tool) call returns the refusal text as the tool's output,
  marked as an SDK-generated error so a tool with a typed output schema does not try to validate it;
- a refused handoff leaves the current agent in charge: the handoff call gets the refusal text as its
  output (any further handoff calls of the same response get the SDK's own "ignored" text, as the SDK
  does when a model asks for several handoffs) and the turn ends with "run again".

These build the SDK's internal result types, which may move between versions; every name used here
is listed in :data:`INTERNAL_NAMES` and a test resolves each against the installed SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from otel_guard.errors import DelegationRefused
from otel_guard.instrumentation._base import PatchTarget, refusal_text

if TYPE_CHECKING:
    from agents.run_internal.run_steps import SingleStepResult

INTERNAL_NAMES: Final[tuple[PatchTarget, ...]] = (
    ("agents.tool", "_FunctionToolInvocationResult"),
    ("agents.items", "ItemHelpers.tool_call_output_item"),
    ("agents.items", "ToolCallOutputItem"),
    ("agents.run_internal.run_steps", "NextStepRunAgain"),
    ("agents.run_internal.run_steps", "SingleStepResult"),
)
"""SDK names (not patched) that the refusal results are built from."""

IGNORED_HANDOFF_TEXT: Final = "Multiple handoffs detected, ignoring this one."
"""What the SDK answers to every handoff call after the first one in one model response."""


def refused_tool_result(err: DelegationRefused) -> Any:
    """What ``_invoke_function_tool_with_metadata`` returns for a refused tool call."""
    from agents.tool import _FunctionToolInvocationResult

    return _FunctionToolInvocationResult(refusal_text(err), is_sdk_generated_error=True)


def refused_handoff_step(err: DelegationRefused, call: dict[str, Any]) -> SingleStepResult:
    """What ``execute_handoffs(**call)`` returns when the handoff it would take is refused."""
    from agents.items import ItemHelpers, ToolCallOutputItem
    from agents.run_internal.run_steps import NextStepRunAgain, SingleStepResult

    agent = call["public_agent"]
    # The SDK appends to the caller's list in place and returns it; do the same.
    new_step_items = call["new_step_items"]
    for index, run_handoff in enumerate(call["run_handoffs"]):
        text = refusal_text(err) if index == 0 else IGNORED_HANDOFF_TEXT
        new_step_items.append(
            ToolCallOutputItem(
                output=text,
                raw_item=ItemHelpers.tool_call_output_item(run_handoff.tool_call, text),
                agent=agent,
            )
        )
    return SingleStepResult(
        original_input=call["original_input"],
        model_response=call["new_response"],
        pre_step_items=call["pre_step_items"],
        new_step_items=new_step_items,
        next_step=NextStepRunAgain(),
        tool_input_guardrail_results=list(call.get("tool_input_guardrail_results") or []),
        tool_output_guardrail_results=list(call.get("tool_output_guardrail_results") or []),
    )
