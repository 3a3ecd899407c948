"""Situational guidance for CrewAI agents that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, before the first model request of an agent run, a
``before_llm_call`` hook (CrewAI's own: it may change the request's messages in place) looks at the
tools the run's model is given. When one of them reaches an agent on the current call path -- a
tool named like it, or a delegation tool with it among the coworkers -- the run's user turn (the
newest user message: the task prompt, or the request of ``kickoff``) starts with
:func:`otel_guard.prompt.guidance_for`: where the agent is, the path that led there, and which calls
would be refused. The agent's role, goal and backstory (the system prompt) are never changed, and the
message is changed in the run's own history only, once per run.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard import prompt
from otel_guard.instrumentation.crewai._names import reachable
from otel_guard.instrumentation.crewai._scope import current_run
from otel_guard.settings import current_settings


def add_guidance(hook: Any) -> None:
    """CrewAI's ``before_llm_call`` hook: the situational prefix on the run's user turn."""
    run = current_run()
    if run is None or run.guided or not current_settings().situational_prompt:
        return
    if hook.agent is not run.agent or not is_instrumentation_enabled():
        return  # a model call of no run this instrumentation guards
    run.guided = True
    tools = getattr(hook.executor, "original_tools", None) or ()
    prefix = prompt.guidance_for(run.name, reachable(tools))
    if prefix is not None:
        _lead_user_turn(hook.messages, prefix)


def _lead_user_turn(messages: list[Any], prefix: str) -> None:
    """Put ``prefix`` at the start of the newest user message, in place (it is the run's history)."""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            message["content"] = f"{prefix}\n\n{content}"
        elif isinstance(content, list):
            message["content"] = [{"type": "text", "text": prefix}, *content]
        return
