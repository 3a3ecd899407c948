"""Situational guidance for Agent Framework agents that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent whose tools include an agent already on the
path that led to its run (``budget``, called by ``planner``, with a ``planner`` tool) is told so at the
start of its user turn: :func:`otel_guard.prompt.guidance_for` names the path and says not to call
back into it. The text leads the newest user message of the run's input (``AgentContext.messages``,
which agent middleware may change before the run starts); the instructions and the system prompt are
never changed, so a shared, cached system prefix stays the same.

The tools considered are those the run starts with: the agent's own (``tools=``) and the run's
(``run(tools=...)``), under their tool names, and an agent offered as a tool (``agent.as_tool()``)
under its agent's name as well. Tools added during the run (MCP servers, context providers) are not.
A run with no user text (one that continues with tool results or approvals) gets no guidance.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from agent_framework import AgentContext, Content

from otel_guard.instrumentation.agent_framework._scope import agent_name
from otel_guard.instrumentation.agent_framework._tools import agent_behind
from otel_guard.prompt import guidance_for


def tool_docs(context: AgentContext) -> dict[str, str | None]:
    """Tool name -> description, for every tool the run starts with (agents under their name too)."""
    defaults = getattr(context.agent, "default_options", None)
    declared = defaults.get("tools") if isinstance(defaults, dict) else None
    options = context.options or {}
    docs: dict[str, str | None] = {}
    for tool in (*_listed(declared), *_listed(context.tools), *_listed(options.get("tools"))):
        name = getattr(tool, "name", None)
        if not isinstance(name, str):
            continue
        description = getattr(tool, "description", None)
        docs.setdefault(name, description)
        agent = agent_behind(tool)
        if agent is not None:
            docs.setdefault(agent_name(agent), description)
    return docs


def _listed(tools: object) -> Iterable[Any]:
    if tools is None:
        return ()
    if isinstance(tools, list | tuple):
        return tools
    return (tools,)


def guide(context: AgentContext, name: str) -> None:
    """Lead the run's user turn with the guidance, when one of its tools is an agent on its path."""
    turn = _user_turn(context.messages)
    if turn is None:
        return
    prefix = guidance_for(name, tool_docs(context))
    if prefix is None:
        return
    message = copy.copy(context.messages[turn])  # the caller's message is left as it was
    message.contents = [Content.from_text(prefix), *message.contents]
    context.messages[turn] = message


def _user_turn(messages: list[Any]) -> int | None:
    """The index of the newest user message that says something (text, not tool results)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role != "user":
            continue
        if any(content.type == "text" for content in message.contents):
            return index
        return None
    return None
