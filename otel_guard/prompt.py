"""Situational guidance: tell the model inside an agentic function that it is inside it, and how it
got there.

The guard refuses a re-entry; this text makes it rarer. It goes at the start of the *user* turn,
never into the system prompt, so a shared system prefix stays constant and cached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from otel_guard.chain import Hop
from otel_guard.guard import current_chain
from otel_guard.policy import waiting

_ARROW = " → "  # the same arrow as a refusal's path


def situational_prefix(
    fn_name: str, fn_doc: str | None = "", *, path: Sequence[str] = (), waiting: Sequence[str] | None = None
) -> str:
    """The user-turn guidance for a model running inside ``fn_name``.

    ``path`` is the call path that led to ``fn_name``, oldest first (``["planner", "budget"]``); it
    may end with ``fn_name`` or leave it out. With a path longer than ``fn_name`` alone, the text
    names the path and says that calling any agent on it is refused, not only ``fn_name``.

    The warning comes first; a non-empty docstring comes last, so the description that tempts the
    model to call the function never outweighs the warning. An empty docstring adds no job line.
    ``waiting`` names the agents of ``path`` that a call would re-enter (default: all of them); an
    agent that handed off (a transfer) waits for nothing, and calling it is no re-entry.
    """
    text = (
        f"[Execution context] You are currently running INSIDE the agentic function `{fn_name}`. "
        f"The tool list may include `{fn_name}` itself — do NOT call it. Calling `{fn_name}` "
        "re-enters where you are now and causes infinite recursion."
    )
    names = list(path)
    if not names or names[-1] != fn_name:
        names.append(fn_name)
    avoid = set(names if waiting is None else waiting)
    others = list(dict.fromkeys(name for name in names if name != fn_name and name in avoid))
    if others:
        listed = ", ".join(f"`{name}`" for name in others)
        text += (
            f" You were called along the path {_ARROW.join(names)}: calling an agent already on it "
            f"re-enters it and is refused, so do NOT call {listed} either."
        )
    text += " Use lower-level tools (search / read-write files / run code) to do the work directly."
    doc = (fn_doc or "").strip()
    if doc:
        text += f"\n\nThis function's job: {doc}"
    return text


def current_path(agent: str) -> list[str]:
    """The call path that leads to ``agent`` in the current context: the agents of the chain in
    force, oldest first, then ``agent`` unless the chain's last hop already is ``agent`` (inside its
    own hop)."""
    chain = current_chain()
    names = [hop.agent for hop in chain.hops] if chain is not None else []
    if not names or names[-1] != agent:
        names.append(agent)
    return names


def guidance_for(agent: str, tool_docs: Mapping[str, str | None]) -> str | None:
    """The situational prefix for a model running inside ``agent`` that sees the tools ``tool_docs``
    (tool name -> description), or ``None`` when no tool is an agent on the current call path.

    This is what every runtime's instrumentation calls: the path is read from the chain in force, so
    a budget agent called by a planner is warned off a ``planner`` tool as well as a ``budget`` one.
    """
    path = current_path(agent)
    waiting = _waiting_names(agent)
    if not any(name in tool_docs for name in waiting):
        return None
    return situational_prefix(agent, tool_docs.get(agent) or "", path=path, waiting=waiting)


def _waiting_names(agent: str) -> list[str]:
    """The agents on the current path that a call from ``agent`` would re-enter: every agent of the
    chain still waiting for an answer (:func:`otel_guard.policy.waiting`), and ``agent`` itself."""
    chain = current_chain()
    if chain is None:
        return [agent]
    return [hop.agent for hop in waiting(chain.hops, Hop(agent))] + [agent]
