"""Agent runs as hops: ``MultiStepAgent.run``, for every way a smolagents agent runs.

``agent.run(task)``, ``agent.run(task, stream=True)`` and a managed agent's call by its manager
(``MultiStepAgent.__call__``, which runs it) all go through ``run``. A run is a hop
``invoke_agent {agent.name}`` (an agent without a name: its class name, ``ToolCallingAgent``), around
the whole run, so its model requests, tool calls and managed-agent calls happen inside it: a managed
agent called by its manager is one hop into it. A refused run raises
:class:`~otel_guard.DelegationRefused` before the task enters the agent's memory; inside a manager's
step (or a tool's body) the step fails with the refusal's text (:mod:`._refusals`).

A run inside a tool call of its own name (tool ``budget`` running agent ``budget``) is that call's
hop, not a second one. ``stream=True`` returns a generator of the run's steps: the hop stays open
until it is exhausted, closed or dropped, and each step runs inside the hop's context (the
generator's consumer runs outside it, between steps).

With a model budget on, the run's model requests count against its tree (:mod:`._usage`). With
``OTEL_GUARD_SITUATIONAL_PROMPT=true`` the task of a run whose agent can call an agent on its
call path (a tool or managed agent named like it) starts with the situational guidance: the task is
the user turn of the run; the system prompt is never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from otel_guard.guard import delegate
from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.instrumentation.smolagents._refusals import watch
from otel_guard.instrumentation.smolagents._scope import in_tool_call, tool_call_in_progress
from otel_guard.instrumentation.smolagents._usage import count_requests_of
from otel_guard.prompt import guidance_for
from otel_guard.settings import current_settings

_FINAL_ANSWER = "final_answer"
"""The tool every agent has for its answer: it delegates nothing."""


def agent_name(agent: Any) -> str:
    """The hop name of a smolagents agent: its ``name``, or its class name when it has none."""
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else type(agent).__name__


@unless_suppressed
def guard_run(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``MultiStepAgent.run``: the run is one hop (or the tool call of its name it runs in)."""
    name = agent_name(instance)
    watch(instance)
    hop = None if tool_call_in_progress() == name else delegate(name)
    ctx = otel_context.get_current() if hop is None else hop.start()  # a refusal raises here
    ctx = in_tool_call(None, ctx)  # what runs inside is this run's own
    settings = current_settings()
    restore = count_requests_of(instance) if settings.model_budgets_on else None

    def end(exc: BaseException | None) -> None:
        if restore is not None:
            restore()
        if hop is not None:
            hop.finish(exc)

    token = otel_context.attach(ctx)
    try:
        if settings.situational_prompt:
            args, kwargs = _guided(instance, name, args, kwargs)
        result = wrapped(*args, **kwargs)
    except BaseException as exc:
        otel_context.detach(token)
        end(exc)
        raise
    otel_context.detach(token)
    if _streams(args, kwargs) and isinstance(result, Iterator):
        return _steps_in_context(result, ctx, end)
    end(None)
    return result


def _streams(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``run(task, stream, ...)`` was asked to stream its steps."""
    return bool(kwargs["stream"] if "stream" in kwargs else len(args) > 1 and args[1])


def _steps_in_context(
    steps: Iterator[Any], ctx: Context, end: Callable[[BaseException | None], None]
) -> Iterator[Any]:
    """The steps of a streamed run, each made inside the run's context; ``end`` when they end."""
    outcome: BaseException | None = None
    try:
        while True:
            token = otel_context.attach(ctx)
            try:
                step = next(steps)
            except StopIteration:
                return
            finally:
                otel_context.detach(token)
            yield step
    except GeneratorExit:
        token = otel_context.attach(ctx)
        try:
            close = getattr(steps, "close", None)
            if close is not None:
                close()  # the run's own cleanup runs inside the run
        finally:
            otel_context.detach(token)
        raise
    except BaseException as exc:
        outcome = exc
        raise
    finally:
        end(outcome)


def _guided(
    agent: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``run``'s arguments, the task led by the situational guidance when it applies (asked with
    ``situational_prompt`` on)."""
    task = args[0] if args else kwargs.get("task")
    if not isinstance(task, str):
        return args, kwargs
    prefix = guidance_for(name, tool_docs(agent))
    if prefix is None:
        return args, kwargs
    guided = f"{prefix}\n\n{task}"
    return ((guided, *args[1:]), kwargs) if args else (args, {**kwargs, "task": guided})


def tool_docs(agent: Any) -> dict[str, str | None]:
    """Hop name -> description of everything ``agent``'s model can call: its tools and its managed
    agents (each under the name the model calls it by, which is its hop's name)."""
    docs: dict[str, str | None] = {}
    for name, tool in {**agent.tools, **agent.managed_agents}.items():
        if name != _FINAL_ANSWER:
            description = getattr(tool, "description", None)
            docs[name] = description if isinstance(description, str) else None
    return docs
