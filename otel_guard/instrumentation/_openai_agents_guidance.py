"""Situational guidance for OpenAI Agents SDK agents whose own name is among their tools.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent that can call itself -- ``agent.as_tool(...)``
in its own ``tools``, or any function tool named exactly like the agent -- is told at the start of
its user turn that it is running inside that function and must not call it
(:func:`otel_guard.situational_prefix`). The text is added to what the model receives on each call
(after any ``RunConfig.call_model_input_filter`` of the application), into the newest user message;
the agent's instructions (the system prompt) are never changed, and nothing is written to the run's
history or session.

The job line is the self-tool's description, else the agent's ``handoff_description``, else its
instructions when they are a string. Only the agent's own ``tools`` list is considered (tools an MCP
server lists at run time are not).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from otel_guard.prompt import situational_prefix

if TYPE_CHECKING:
    from agents.agent import Agent
    from agents.run_config import ModelInputData


def guidance_for(agent: Agent[Any]) -> str | None:
    """The situational prefix for ``agent``, or ``None`` when it cannot call itself."""
    name = agent.name
    for tool in getattr(agent, "tools", None) or ():
        inner = getattr(tool, "_agent_instance", None)
        if getattr(tool, "name", None) == name or getattr(inner, "name", None) == name:
            doc = getattr(tool, "description", "") or agent.handoff_description or ""
            if not doc and isinstance(agent.instructions, str):
                doc = agent.instructions
            return situational_prefix(name, doc)
    return None


def with_guidance(model_input: ModelInputData, prefix: str) -> ModelInputData:
    """``model_input`` with ``prefix`` at the start of its newest user message.

    The message is copied, never changed in place: the items are the run's history. Input without a
    user message (a continuation that carries only tool outputs) is returned unchanged.
    """
    items: list[Any] = list(model_input.input)
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, dict) and item.get("role") == "user":
            items[index] = _prefixed(item, prefix)
            return dataclasses.replace(model_input, input=items)
    return model_input


def _prefixed(message: dict[str, Any], prefix: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        new_content: Any = f"{prefix}\n\n{content}"
    elif isinstance(content, list):
        new_content = [{"type": "input_text", "text": prefix}, *content]
    else:
        return message
    return {**message, "content": new_content}
