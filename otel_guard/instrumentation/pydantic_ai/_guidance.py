"""Situational guidance for pydantic-ai agents that can see a tool named after an agent on their path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, an agent that can see a tool with its own name (an agent
exposed to itself as a tool, the usual way a self-delegation loop starts), or with the name of an agent
on the call path that led to it (a budget agent called by a planner, with a ``planner`` tool), is told
at the start of its user turn that it is running inside that function, the path that led to it, and
that calling any agent on it is refused (:func:`otel_guard.prompt.guidance_for`). The text goes into
the user prompt of the run, never into the instructions or system prompt, so a shared, cached system
prefix stays constant.

Only tools whose names are known before the run starts are considered: function tools registered with
``@agent.tool`` / ``@agent.tool_plain`` / ``tools=[...]`` and those of ``FunctionToolset``s passed to
the agent or to the run. Tools of dynamic toolsets (``@agent.toolset``) and MCP servers are listed by
their toolset only during the run and are not considered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from otel_guard import prompt

if TYPE_CHECKING:
    from pydantic_ai.toolsets import AbstractToolset


def _function_tool_docs(toolsets: Iterable[AbstractToolset[Any]]) -> dict[str, str]:
    """Tool name -> description, for every function tool of ``toolsets`` (wrappers included)."""
    from pydantic_ai.toolsets import FunctionToolset

    docs: dict[str, str] = {}

    def visit(leaf: AbstractToolset[Any]) -> None:
        if isinstance(leaf, FunctionToolset):
            for name, tool in leaf.tools.items():
                docs.setdefault(name, tool.description or "")

    for toolset in toolsets:
        toolset.apply(visit)
    return docs


def guidance_for(
    agent_name: str,
    agent_toolsets: Sequence[AbstractToolset[Any]],
    run_toolsets: Sequence[AbstractToolset[Any]] | None,
) -> str | None:
    """The situational prefix for ``agent_name``, or ``None`` when none of its tools is named after an
    agent on its call path (itself included)."""
    docs = _function_tool_docs([*agent_toolsets, *(run_toolsets or ())])
    return prompt.guidance_for(agent_name, docs)


def prefixed_prompt(prefix: str, user_prompt: str | Sequence[Any] | None) -> str | list[Any] | None:
    """``user_prompt`` with ``prefix`` at its start, in the prompt's own form.

    A string stays a string (prefix, blank line, prompt); a sequence of user content gets the prefix
    as its first item. ``None`` (a run that continues from history without a new user turn) has no
    user turn to lead, and is returned as is.
    """
    if user_prompt is None:
        return None
    if isinstance(user_prompt, str):
        return f"{prefix}\n\n{user_prompt}"
    return [prefix, *user_prompt]
