"""Agent runs as hops: ``run()`` of every workflow agent and ``AgentWorkflow``, ended by LlamaIndex's
own span of the run.

``FunctionAgent``, ``ReActAgent`` (any ``BaseWorkflowAgent``) and ``AgentWorkflow`` are workflows:
``run()`` starts the run as a task and returns its handler at once, and LlamaIndex's instrumentation
dispatcher opens a span for the run inside that task (``{Workflow}.run-{uuid}``) and closes it when the
run ends, however it ends, before the handler's result is set. So:

* ``run()`` (patched: the dispatcher's handlers cannot refuse anything, it swallows their errors)
  decides the hop ``invoke_agent {agent.name}`` (an ``AgentWorkflow``'s is its ``root_agent``) and
  attaches its context while the run's task is created, so every step of the run, every model and
  tool call, inherits the chain. A refused run raises :class:`~otel_guard.DelegationRefused` from
  ``run()``: the run never starts. A run of the agent a tool call of the same name is for joins that
  call's hop instead (one call, one hop); a run of another agent directly in a tool's body (an
  agent called as a tool) is decided in the chain the call was made in, taking the tool's place;
* :class:`RunEnds`, a span handler on the dispatcher that opens the runs' spans, ends the hop (and
  the run's handoffs) at the run span's exit or drop, with the run's error if it failed.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, ``run()`` also leads the run's user message with the
situational guidance (:mod:`._guidance`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Final

from llama_index.core.agent.workflow import AgentWorkflow
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index_instrumentation import get_dispatcher
from llama_index_instrumentation.dispatcher import Dispatcher
from llama_index_instrumentation.span import BaseSpan
from opentelemetry import baggage
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue
from pydantic import Field

from otel_guard.guard import delegate
from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.instrumentation.llama_index._guidance import guided
from otel_guard.instrumentation.llama_index._scope import CALL, RUN, Call, Run
from otel_guard.settings import current_settings
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY, GEN_AI_CONVERSATION_ID


def agent_name(workflow: Any) -> str:
    """The agent a run is a hop into: the agent, or the agent an ``AgentWorkflow`` starts with."""
    return str(workflow.root_agent if isinstance(workflow, AgentWorkflow) else workflow.name)


@unless_suppressed
def guard_run(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``BaseWorkflowAgent.run`` and ``AgentWorkflow.run``: the run is a hop until its span ends."""
    name = agent_name(instance)
    parent = otel_context.get_current()
    call = otel_context.get_value(CALL, parent)
    if isinstance(call, Call) and call.name == name:
        run, ctx = Run(instance, None), parent  # the tool call's hop is this run's
    else:
        hop = delegate(name, attributes=_conversation(args, kwargs))
        token = otel_context.attach(_in_place_of(call, parent))
        try:
            ctx = hop.start()  # a refusal raises here: the run never starts
        finally:
            otel_context.detach(token)
        run = Run(instance, hop)
    # What runs inside is this run's own: no tool call of its caller's is in progress there.
    token = otel_context.attach(Context({**ctx, CALL: None, RUN: run}))  # one copy, not two
    try:
        if current_settings().situational_prompt:
            args = guided(name, instance, args, kwargs) or args
        handler = wrapped(*args, **kwargs)
    except BaseException as exc:
        run.end(exc)
        raise
    finally:
        otel_context.detach(token)
    return handler


def _in_place_of(call: object, parent: Context) -> Context:
    """Where a run is decided: ``parent``, or for a run directly in a tool call's body (nothing
    decided between: the chain is still the call's) ``parent`` with the chain the call was made in.

    An agent called as a tool is then one place of the chain, in the agent's name (``planner →
    budget``, not ``planner → ask_budget → budget``), as the processor reads a tool call with an agent
    run below it; the run's hop is still a child of the call's span.
    """
    if not isinstance(call, Call) or call.caller_chain is None or call.hop.context is None:
        return parent
    chain = baggage.get_baggage(CHAIN_BAGGAGE_KEY, parent)
    if chain is None or chain is not baggage.get_baggage(CHAIN_BAGGAGE_KEY, call.hop.context):
        return parent
    return baggage.set_baggage(CHAIN_BAGGAGE_KEY, call.caller_chain, parent)


def _conversation(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, AttributeValue] | None:
    """``gen_ai.conversation.id`` of ``run(user_msg, chat_history, memory, ...)``: the session id of
    the memory it is given (the key its chat history is kept under), or ``None``."""
    memory = kwargs.get("memory", args[2] if len(args) > 2 else None)
    session_id = getattr(memory, "session_id", None)
    return {GEN_AI_CONVERSATION_ID: session_id} if isinstance(session_id, str) and session_id else None


class RunEnds(BaseSpanHandler[BaseSpan]):  # type: ignore[misc, unused-ignore]  # Any without LlamaIndex
    """Ends a guarded run's hop when LlamaIndex's span of the run ends (see the module docstring).

    Every other span passes through untouched: :meth:`span_enter` looks only for the span of the run
    in the current context (its workflow the span's instance, its id ``{Workflow}.run-{uuid}``).
    """

    # Fields, not private attributes: a pydantic model reads a private attribute through its
    # ``__getattr__``, and the dispatcher calls the handler at the start and end of every span.
    runs_open: dict[str, Run] = Field(default_factory=dict, exclude=True, repr=False)
    leaving: bool = Field(default=False, exclude=True, repr=False)

    @classmethod
    def class_name(cls) -> str:
        return "OtelGuardRunEnds"

    @property
    def open_runs(self) -> int:
        """How many guarded runs have started and not ended."""
        return len(self.runs_open)

    def span_enter(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        parent_id: str | None = None,
        tags: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if instance is None or ".run-" not in id_:
            return  # not the span of a workflow's run (most spans): no context lookup
        run = otel_context.get_value(RUN)
        if (
            isinstance(run, Run)
            and run.span_id is None
            and instance is run.workflow
            and id_.startswith(f"{type(instance).__name__}.run-")
        ):
            run.span_id = id_
            self.runs_open[id_] = run

    def span_exit(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        result: Any | None = None,
        **kwargs: Any,
    ) -> None:
        run = self.runs_open.pop(id_, None)
        if run is not None:
            run.end(None)
            self._left_if_done()

    def span_drop(
        self,
        id_: str,
        bound_args: inspect.BoundArguments,
        instance: Any | None = None,
        err: BaseException | None = None,
        **kwargs: Any,
    ) -> None:
        run = self.runs_open.pop(id_, None)
        if run is not None:
            run.end(err)
            self._left_if_done()

    def stay(self, on: bool) -> None:
        """On :func:`run_dispatcher` (``on``), or off it once the runs it has seen start have ended."""
        self.leaving = not on
        if on:
            _attach(self)
        else:
            self._left_if_done()

    def _left_if_done(self) -> None:
        if self.leaving and not self.runs_open:
            _detach(self)

    # BaseSpanHandler's abstract steps: this handler keeps no spans of its own.
    def new_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_to_exit_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_to_drop_span(self, *args: Any, **kwargs: Any) -> None:
        return None


RUN_SPANS_MODULE: Final = "workflows.runtime.types.step_function"
"""The module of LlamaIndex's workflows whose dispatcher opens and closes every run's span."""


def run_dispatcher() -> Dispatcher:
    """Where :data:`run_ends` listens: the dispatcher that opens the runs' spans.

    A dispatcher hands a span to its own handlers and its ancestors', so a handler there sees the
    runs' spans and none of the others (a one-tool agent run makes 15: steps, model and tool calls;
    on the root the handler cost about 44 k instructions a hop). Where that module or its dispatcher is not
    found (another version of the workflows package), the root dispatcher, which sees every span.
    """
    try:
        module = importlib.import_module(RUN_SPANS_MODULE)
    except ImportError:
        return get_dispatcher()
    dispatcher = getattr(module, "_dispatcher", None)
    return dispatcher if isinstance(dispatcher, Dispatcher) else get_dispatcher()


def _attach(handler: BaseSpanHandler[Any]) -> None:
    dispatcher = run_dispatcher()
    if all(other is not handler for other in dispatcher.span_handlers):
        # A new list, never one changed in place: the dispatcher may be iterating the old one.
        dispatcher.span_handlers = [*dispatcher.span_handlers, handler]


def _detach(handler: BaseSpanHandler[Any]) -> None:
    dispatcher = run_dispatcher()
    dispatcher.span_handlers = [other for other in dispatcher.span_handlers if other is not handler]


run_ends = RunEnds()
"""The one handler: :meth:`RunEnds.stay` puts it on :func:`run_dispatcher` and takes it off."""
