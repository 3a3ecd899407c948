"""Situational guidance: tell the model inside an agentic function that it is inside it.

The guard refuses a re-entry; this text makes it rarer. It goes at the start of the *user* turn,
never into the system prompt, so a shared system prefix stays constant and cached.
"""

from __future__ import annotations


def situational_prefix(fn_name: str, fn_doc: str | None = "") -> str:
    """The user-turn guidance for a model running inside ``fn_name``.

    The warning comes first; a non-empty docstring comes last, so the description that tempts the
    model to call the function never outweighs the warning. An empty docstring adds no job line.
    """
    text = (
        f"[Execution context] You are currently running INSIDE the agentic function `{fn_name}`. "
        f"The tool list may include `{fn_name}` itself — do NOT call it. Calling `{fn_name}` "
        "re-enters where you are now and causes infinite recursion. Use lower-level tools "
        "(search / read-write files / run code) to do the work directly."
    )
    doc = (fn_doc or "").strip()
    if doc:
        text += f"\n\nThis function's job: {doc}"
    return text
