"""The guard's hooks in CrewAI's hook registry: registered by ``instrument()``, removed by
``uninstrument()``.

The tool-call hooks are the hops of every tool call and are always registered. The model-call hooks
are needed only for model budgets and situational guidance, and CrewAI pays for every hook point
that has a hook (it builds a context and emits a ``HookDispatchedEvent`` on each model call: a
tenth of an offline run's CPU time for three model calls), so they are registered once a setting
asks for them: at ``instrument()``, or at the start of the first agent run that needs them.

CrewAI also emits a ``HookDispatchedEvent`` after every tool call's before and after hooks once
they have any hook. Where the only hooks that ran were the guard's and they changed nothing (an
allowed call), that event says nothing CrewAI would have said unguarded, and building and emitting it
(a pydantic event, its record in the run's state, its handlers, and with the two of a call about 510
type-attribute cache misses a run in the bench) is work the hop made CrewAI do: :func:`quiet_dispatch`
leaves it out. A dispatch with any other hook, or in which the guard's hook blocked or changed the
call (a refusal), emits it as CrewAI does.

An agent's executor copies the global model-call hooks into its own lists when CrewAI builds it,
which may be long before the run (a crew builds its agents' executors as it starts, an agent keeps
its executor from task to task): at the start of each run, the hooks an existing executor lacks are
added to its lists, as CrewAI would have copied them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from otel_guard.settings import current_settings

Hook = Callable[[Any], Any]

_registered: list[tuple[Any, Hook]] = []  # (InterceptionPoint, hook), in registration order
_tool_hooks: dict[Any, list[Hook]] = {}  # the tool-call points' live global hook lists
_model_hooks_on = False
_registering = threading.Lock()  # runs in several threads may all find the model-call hooks missing


def register_hooks() -> None:
    """The tool-call hooks, and the model-call hooks if a setting in force needs them."""
    from crewai.hooks.dispatch import InterceptionPoint, get_global_hook_list

    from otel_guard.instrumentation.crewai import _tools as tools

    _register(InterceptionPoint.PRE_TOOL_CALL, tools.before_tool_call)
    _register(InterceptionPoint.POST_TOOL_CALL, tools.after_tool_call)
    for point in (InterceptionPoint.PRE_TOOL_CALL, InterceptionPoint.POST_TOOL_CALL):
        _tool_hooks[point] = get_global_hook_list(point)
    settings = current_settings()
    if settings.model_budgets_on or settings.situational_prompt:
        _register_model_hooks()


def need_model_hooks(agent: Any) -> None:
    """Before ``agent`` runs: the model-call hooks, if a setting in force needs them, registered and
    in the lists of the executor the agent already has."""
    if not _model_hooks_on:
        settings = current_settings()
        if not (settings.model_budgets_on or settings.situational_prompt):
            return
        _register_model_hooks()
    executor = getattr(agent, "agent_executor", None)
    if executor is None:
        return  # CrewAI builds it in the run, from the global lists
    from crewai.hooks.dispatch import InterceptionPoint

    lists = {
        InterceptionPoint.PRE_MODEL_CALL: getattr(executor, "before_llm_call_hooks", None),
        InterceptionPoint.POST_MODEL_CALL: getattr(executor, "after_llm_call_hooks", None),
    }
    for point, hook in tuple(_registered):
        copied = lists.get(point)
        if copied is not None and hook not in copied:
            copied.append(hook)


def _register_model_hooks() -> None:
    global _model_hooks_on
    from crewai.hooks.dispatch import InterceptionPoint

    from otel_guard.instrumentation.crewai import _guidance as guidance
    from otel_guard.instrumentation.crewai import _usage as usage

    with _registering:
        if _model_hooks_on:
            return
        _register(InterceptionPoint.PRE_MODEL_CALL, guidance.add_guidance)
        _register(InterceptionPoint.PRE_MODEL_CALL, usage.before_model_call)
        _register(InterceptionPoint.POST_MODEL_CALL, usage.after_model_call)
        _model_hooks_on = True


def quiet_dispatch(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``crewai.hooks.dispatch._emit_telemetry`` (point, outcome, hook count, ...): no
    ``HookDispatchedEvent`` for a tool-call dispatch that ran only the guard's hooks and proceeded."""
    if len(args) >= 3 and args[1] == "proceeded" and _only_the_guards(args[0], args[2]):
        return None
    return wrapped(*args, **kwargs)


def _only_the_guards(point: Any, count: object) -> bool:
    """Whether the ``count`` hooks a dispatch at ``point`` ran were the guard's and no others.

    A tool-call dispatch runs the point's global hooks, then the scoped ones of the execution: as
    many hooks as the global list holds, all of them the guard's, is the guard's alone.
    """
    hooks = _tool_hooks.get(point)
    if hooks is None or len(hooks) != count:
        return False
    return all((point, hook) in _registered for hook in hooks)


def unregister_all() -> None:
    global _model_hooks_on
    from crewai.hooks.dispatch import unregister

    with _registering:
        _model_hooks_on = False
        _tool_hooks.clear()
        while _registered:
            unregister(*_registered.pop())


def _register(point: Any, hook: Hook) -> None:
    from crewai.hooks.dispatch import register

    registered = _while_registered(point, hook)
    register(point, registered)
    _registered.append((point, registered))


def _while_registered(point: Any, hook: Hook) -> Hook:
    """``hook``, doing nothing once it is no longer registered at ``point``.

    An executor built while instrumented keeps calling the model-call hooks it copied after
    ``uninstrument()``; this makes those calls nothing.
    """
    from crewai.hooks.dispatch import get_global_hook_list

    hooks = get_global_hook_list(point)  # the live list: CrewAI never rebinds it

    def registered(context: Any) -> Any:
        return hook(context) if registered in hooks else None

    registered.__name__ = registered.__qualname__ = f"otel_guard_{hook.__name__}"
    return registered
