"""Situational guidance for LangChain agents that can call an agent on their own call path.

With ``OTEL_GUARD_SITUATIONAL_PROMPT=true``, a model whose tools include one named after an agent on
the path that led to it (``budget``, called by ``planner``, with a ``planner`` tool) gets
:func:`otel_guard.prompt.guidance_for` at the start of its user turn: the newest ``HumanMessage`` of
what it is sent. LangChain's callbacks see a model's input but cannot change it; a ``create_agent``
agent's middleware can (``wrap_model_call``), and :class:`GuidanceMiddleware` is that middleware.

Only the request is changed, never the graph's state: the conversation the app keeps and checkpoints
holds the user's own words, and the system message is never touched, so a cached system prefix stays
cached. The tools considered are those of the request, after any other middleware changed them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool

from otel_guard.guard import current_chain
from otel_guard.prompt import guidance_for
from otel_guard.settings import current_settings

ModelCallResult = ModelResponse[Any] | AIMessage


class GuidanceMiddleware(AgentMiddleware[Any, Any, Any]):
    """Puts the situational guidance at the start of the model's user turn (see the module docstring).

    ``agent`` is the agent the model runs in (``create_agent(name=...)``); without one, the agent of
    the hop the model call is made in. ``active``, when given, is asked at each model call whether the
    guard still adds the guidance (the instrumentor's middleware stops when it is uninstrumented).
    """

    def __init__(self, agent: str | None = None, *, active: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.agent = agent
        self._active = active

    @property
    def name(self) -> str:
        return "otel_guard_guidance"

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> ModelCallResult:
        return handler(self._guided(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult:
        return await handler(self._guided(request))

    def _guided(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        if self._active is not None and not self._active():
            return request
        messages = _guided(request.messages, request.tools, self.agent)
        return request if messages is None else request.override(messages=cast(list[AnyMessage], messages))


def guided_messages(
    messages: Sequence[BaseMessage],
    tools: Sequence[BaseTool | Mapping[str, Any]],
    *,
    agent: str | None = None,
) -> list[BaseMessage]:
    """``messages`` with the guidance leading their newest ``HumanMessage``, when it applies; else a
    copy of ``messages`` as they are. For a model node of a hand-built graph (docs/runtimes.md)."""
    guided = _guided(messages, tools, agent)
    return list(messages) if guided is None else guided


def _guided(
    messages: Sequence[BaseMessage], tools: Sequence[BaseTool | Mapping[str, Any]], agent: str | None
) -> list[BaseMessage] | None:
    """The guided messages, or ``None`` when no guidance applies: the setting is off, no tool is
    named after an agent on the path, there is no human message, or it already starts with it."""
    if not current_settings().situational_prompt:
        return None
    name = agent if agent is not None else _current_agent()
    if name is None:
        return None
    turn = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)), None)
    if turn is None:
        return None
    prefix = guidance_for(name, tool_docs(tools))
    if prefix is None:
        return None
    message = messages[turn]
    content = _prefixed(message.content, prefix)
    if content is None:
        return None
    guided = list(messages)
    guided[turn] = message.model_copy(update={"content": content})
    return guided


def tool_docs(tools: Sequence[BaseTool | Mapping[str, Any]]) -> dict[str, str | None]:
    """Tool name -> description for the tools a model is given: ``BaseTool``s and tool dicts (the
    OpenAI form ``{"type": "function", "function": {...}}`` or a bare ``{"name": ...}``)."""
    docs: dict[str, str | None] = {}
    for tool in tools:
        if isinstance(tool, BaseTool):
            docs.setdefault(tool.name, tool.description)
            continue
        function = tool.get("function")
        spec = function if isinstance(function, Mapping) else tool
        name, description = spec.get("name"), spec.get("description")
        if isinstance(name, str):
            docs.setdefault(name, description if isinstance(description, str) else None)
    return docs


def _current_agent() -> str | None:
    """The agent of the hop in force: the model call is made inside it."""
    chain = current_chain()
    return chain.hops[-1].agent if chain is not None else None


def _prefixed(content: str | list[str | dict[Any, Any]], prefix: str) -> str | list[Any] | None:
    """``content`` led by ``prefix`` in its own form (a string, or a text block first), or ``None``
    when it already starts with it."""
    if isinstance(content, str):
        return None if content.startswith(prefix) else f"{prefix}\n\n{content}"
    first = content[0] if content else None
    text = first.get("text") if isinstance(first, dict) else first
    if isinstance(text, str) and text.startswith(prefix):
        return None
    return [{"type": "text", "text": prefix}, *content]


def with_guidance(kwargs: dict[str, Any], active: Callable[[], bool]) -> dict[str, Any]:
    """``create_agent``'s keyword arguments with :class:`GuidanceMiddleware` last in ``middleware``.

    Last, so it is the innermost ``wrap_model_call`` and sees the request as the model gets it.
    Nothing is added while the setting is off, or when the app passed one of its own.
    """
    if not current_settings().situational_prompt:
        return kwargs
    middleware = list(kwargs.get("middleware") or ())
    if any(isinstance(m, GuidanceMiddleware) for m in middleware):
        return kwargs
    name = kwargs.get("name")
    guidance = GuidanceMiddleware(name if isinstance(name, str) and name else None, active=active)
    return {**kwargs, "middleware": [*middleware, guidance]}
