"""What the guard plugin reads of an ADK callback or tool context, without the work ADK's public
accessors do on every call.

Imported only where ADK is installed. Both readers take the context's own attribute when ADK has it
and its public accessor otherwise, so another ADK version gets the same answer, only slower:

* :func:`calling_agent`: ``get_invocation_context()`` makes a pydantic copy of the whole invocation
  context on every call (about a quarter of a span), for the one attribute the copy leaves as it is;
* :func:`actions_of`: reading ``actions`` first compares every container read from the session state
  with the copy taken at the read (ADK does so itself when it reads the actions after the call).
"""

from __future__ import annotations

from typing import Any


def calling_agent(context: Any) -> Any:
    """The agent a callback or tool ``context`` runs for."""
    invocation = getattr(context, "_invocation_context", None)
    if invocation is None:
        invocation = context.get_invocation_context()
    return invocation.agent


def actions_of(tool_context: Any) -> Any:
    """The ``EventActions`` of a tool call (the same object ``tool_context.actions`` returns)."""
    actions = getattr(tool_context, "_event_actions", None)
    return actions if actions is not None else tool_context.actions
