"""Situational guidance for ADK agents that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, before each model request of an agent whose tools include
an agent on the path that led to it (``planner → budget``, and budget has a ``planner`` tool), the
guard plugin's ``before_model_callback`` puts :func:`otel_guard.prompt.guidance_for` at the start of
the request's newest user message: a text part ahead of the user's own (the user turn of a run, the
request of an ``AgentTool`` call, the context a transferred-to agent is given). Function responses,
which ADK also sends in the user role, are not a user turn and are passed over.

The tools considered are those of the request (``llm_request.tools_dict``, filled by ADK before the
model callbacks: the agent's tools, toolsets and agents as tools), with their descriptions, and the
agents ``transfer_to_agent`` offers that still wait in the chain: a transfer is no cycle into an agent
that handed off (the parent a sub-agent was transferred to from, which ADK lets it transfer back to),
so only a transfer into an agent waiting for an answer (one that called this agent's run as a tool)
is warned off. The system instruction is never changed, so a cached prefix stays cached, and only the
request is: the session's events keep the user's own words.
"""

from __future__ import annotations

from typing import Any

from google.genai import types

from otel_guard.chain import TransferHop
from otel_guard.guard import current_chain
from otel_guard.instrumentation.google_adk._tools import transfer_targets
from otel_guard.policy import waiting
from otel_guard.prompt import guidance_for


def add_guidance(agent: str, llm_request: Any) -> None:
    """Put the situational prefix at the start of ``llm_request``'s newest user message, if it applies."""
    contents: list[types.Content] = llm_request.contents
    index = _newest_user_message(contents)
    if index is None:
        return
    prefix = guidance_for(agent, _tool_docs(llm_request.tools_dict))
    if prefix is None:
        return
    message = contents[index]
    # A new Content in the request's own list: the one there may be the session event's.
    contents[index] = types.Content(
        role="user", parts=[types.Part.from_text(text=prefix), *(message.parts or ())]
    )


def _tool_docs(tools: dict[str, Any]) -> dict[str, str | None]:
    """Tool name -> description for the request's tools, and the agents it may transfer to that wait."""
    docs: dict[str, str | None] = {}
    for name, tool in tools.items():
        docs[name] = getattr(tool, "description", None)
        targets = transfer_targets(tool)
        if targets:
            waits = _waiting_for_a_transfer()
            for target in targets:
                if target in waits:
                    docs.setdefault(target, None)
    return docs


def _waiting_for_a_transfer() -> frozenset[str]:
    """The agents of the chain in force that a transfer from its last place would find waiting (a
    transfer into one of them is a cycle; into any other agent it is not)."""
    chain = current_chain()
    if chain is None:
        return frozenset()
    hops = chain.hops
    return frozenset(hop.agent for hop in waiting(hops, TransferHop(hops[-1].agent)))


def _newest_user_message(contents: list[types.Content]) -> int | None:
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        parts = content.parts or ()
        is_user_text = content.role == "user" and any(part.text for part in parts)
        if is_user_text and not any(part.function_response for part in parts):
            return index
    return None
