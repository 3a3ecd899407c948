"""Situational guidance for Agno agents and teams that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, a run whose agent can call an agent already on the path
that led to it (``budget``, run by planner, with an ``ask_planner`` tool named after... no: with a
tool or team member named like an agent on the path) gets :func:`otel_guard.prompt.guidance_for` at
the start of its input, the run's user turn. The agent's instructions (the system prompt) are never
changed. The callables considered are the agent's tools under their names (functions, ``Function``\\s
and each function of a ``Toolkit``) and, for a team, its members under their names. An input that is
not a string (messages, a model) gets no guidance.
"""

from __future__ import annotations

from typing import Any

from otel_guard.prompt import guidance_for


def tool_docs(agent: Any, name_of: Any) -> dict[str, str | None]:
    """Name -> description of everything ``agent``'s model can call: its tools, a team's members."""
    docs: dict[str, str | None] = {}
    for tool in getattr(agent, "tools", None) or ():
        functions = getattr(tool, "functions", None)
        for item in functions.values() if isinstance(functions, dict) else (tool,):
            name = getattr(item, "name", None) or getattr(item, "__name__", None)
            if isinstance(name, str) and name:
                doc = getattr(item, "description", None) or getattr(item, "__doc__", None)
                docs[name] = doc if isinstance(doc, str) else None
    for member in getattr(agent, "members", None) or ():
        if not callable(member):
            doc = getattr(member, "role", None) or getattr(member, "description", None)
            docs[name_of(member)] = doc if isinstance(doc, str) else None
    return docs


def guided(
    agent: Any, name: str, name_of: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``run``'s arguments, its string input led by the guidance when it applies."""
    text = args[0] if args else kwargs.get("input")
    if not isinstance(text, str):
        return args, kwargs
    prefix = guidance_for(name, tool_docs(agent, name_of))
    if prefix is None:
        return args, kwargs
    led = f"{prefix}\n\n{text}"
    return ((led, *args[1:]), kwargs) if args else (args, {**kwargs, "input": led})
