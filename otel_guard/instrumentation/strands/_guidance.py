"""Situational guidance for Strands agents that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent whose tools include an agent already on the
path that led to its run (``budget``, called by ``planner``, with a ``planner`` tool) is told so at the
start of its user turn: :func:`otel_guard.prompt.guidance_for` names the path and says not to call
back into it. The text leads the invocation's user message (``BeforeInvocationEvent.messages``, the
input Strands lets hooks rewrite before it is added to the history); the system prompt is never
changed, so a shared, cached system prefix stays the same.

The tools considered are those the agent's registry holds when the run starts, under their tool
names, and an agent offered as a tool (``agent.as_tool(...)``) under its agent's name as well. An
invocation with no user text (a continuation carrying only tool results or interrupt responses) gets
no guidance.
"""

from __future__ import annotations

from typing import Any

from otel_guard.prompt import guidance_for


def tool_docs(agent: Any) -> dict[str, str | None]:
    """Tool name -> description, for every tool the agent can call now (agents under their name too)."""
    registry = agent.tool_registry
    docs: dict[str, str | None] = {}
    for tool in (*registry.registry.values(), *registry.dynamic_tools.values()):
        description = tool.tool_spec.get("description")
        docs.setdefault(tool.tool_name, description)
        inner = getattr(tool, "agent", None) if tool.tool_type == "agent" else None
        inner_name = getattr(inner, "name", None)
        if isinstance(inner_name, str):
            docs.setdefault(inner_name, description)
    return docs


def guided_messages(agent: Any, messages: list[Any] | None) -> list[Any] | None:
    """``messages`` with the guidance leading their user turn, or ``None`` when none applies."""
    if not messages:
        return None
    turn = _user_turn(messages)
    if turn is None:
        return None
    prefix = guidance_for(agent.name, tool_docs(agent))
    if prefix is None:
        return None
    message = messages[turn]
    guided = [*messages]
    guided[turn] = {**message, "content": [{"text": prefix}, *message["content"]]}
    return guided


def _user_turn(messages: list[Any]) -> int | None:
    """The index of the newest user message that says something (text, not tool results)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            if any("toolResult" in block or "interruptResponse" in block for block in content):
                return None
            if any("text" in block for block in content):
                return index
    return None
