"""Situational guidance for LlamaIndex agents that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, a run whose agent can reach an agent already on the path
that led to it (``budget``, run by ``planner``'s tool, with a tool named ``planner``) is told so at
the start of its user turn: :func:`otel_guard.prompt.guidance_for` names the path and says not to
call back into it. The text leads the ``user_msg`` given to ``run()``, before LlamaIndex puts it in
the run's memory; the system prompt is never changed, so a shared, cached system prefix stays the
same.

The agent's reach is its ``tools`` under their tool names (with their descriptions) and, in an
``AgentWorkflow``, the agents its root agent may hand off to. A run started without a ``user_msg``
(from a ``start_event`` or a ``chat_history`` alone) gets no guidance.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.agent.workflow import AgentWorkflow
from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.tools import BaseTool

from otel_guard.prompt import guidance_for


def tool_docs(workflow: Any) -> dict[str, str | None]:
    """Tool name -> description, for what the run's agent can call (handoff targets as agents)."""
    docs: dict[str, str | None] = {}
    if isinstance(workflow, AgentWorkflow):
        agent = workflow.agents[workflow.root_agent]
        for name, other in workflow.agents.items():
            allowed = agent.can_handoff_to is None or name in agent.can_handoff_to
            if name != agent.name and allowed:
                docs[name] = other.description
    else:
        agent = workflow
    for tool in agent.tools or ():
        if isinstance(tool, BaseTool):  # LlamaIndex makes every tool given as a function one
            docs.setdefault(tool.metadata.get_name(), tool.metadata.description)
    return docs


def guided(name: str, workflow: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """``run()``'s arguments with the guidance leading the user message, or ``None`` when none applies.

    Returns the new positional arguments; ``kwargs`` is changed in place when ``user_msg`` is there.
    """
    keyword = "user_msg" in kwargs
    given = kwargs["user_msg"] if keyword else args[0] if args else None
    if not isinstance(given, (str, ChatMessage)) or not given:
        return None
    prefix = guidance_for(name, tool_docs(workflow))
    if prefix is None:
        return None
    if isinstance(given, str):
        message: str | ChatMessage = f"{prefix}\n\n{given}"
    else:
        message = given.model_copy(update={"blocks": [TextBlock(text=prefix), *given.blocks]})
    if keyword:
        kwargs["user_msg"] = message
        return args
    return (message, *args[1:])
