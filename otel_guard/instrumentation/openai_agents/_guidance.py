"""Situational guidance for OpenAI Agents SDK agents that can call an agent on their call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent that can call itself -- ``agent.as_tool(...)``
in its own ``tools``, or any function tool named exactly like the agent -- or an agent already on the
call path that led to it (as a tool, by name, or as a handoff) is told at the start of its user turn
that it is running inside that function, the path that led to it, and that calling any agent on it is
refused (:func:`otel_guard.prompt.guidance_for`). The text is added to what the model receives on each call
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

from otel_guard import prompt

if TYPE_CHECKING:
    from agents.agent import Agent
    from agents.run_config import ModelInputData


def guidance_for(agent: Agent[Any]) -> str | None:
    """The situational prefix for ``agent``, or ``None`` when it can call no agent on its path."""
    return prompt.guidance_for(agent.name, _callable_agents(agent))


def _callable_agents(agent: Agent[Any]) -> dict[str, str]:
    """Name -> description of everything ``agent`` can call by a name: its tools (and the agents
    behind ``as_tool`` tools) and its handoffs' agents. The agent's own entry describes it, falling
    back to its ``handoff_description``, then its instructions when they are a string."""
    docs: dict[str, str] = {}
    for tool in getattr(agent, "tools", None) or ():
        description = getattr(tool, "description", "") or ""
        for name in (
            getattr(tool, "name", None),
            getattr(getattr(tool, "_agent_instance", None), "name", None),
        ):
            if isinstance(name, str):
                docs.setdefault(name, description)
    for handoff in getattr(agent, "handoffs", None) or ():
        name = getattr(handoff, "agent_name", None) or getattr(handoff, "name", None)
        if isinstance(name, str):
            docs.setdefault(name, getattr(handoff, "handoff_description", None) or "")
    if agent.name in docs and not docs[agent.name]:
        docs[agent.name] = agent.handoff_description or (
            agent.instructions if isinstance(agent.instructions, str) else ""
        )
    return docs


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
