"""The tool of a call, run as a hop: a proxy whose ``stream`` decides the hop and runs the tool in it.

Strands' ``ExecuteToolStage`` terminal opens Strands' ``execute_tool {name}`` span, makes it current
and iterates ``tool.stream(...)``, stopping at the first ``ToolResultEvent`` (or
``ToolInterruptEvent``) without resuming the stream again. The stream of :class:`ToolInHop`:

* at its first step, decides the call's hop (:func:`~._calls.hop_of`; a handoff's is a transfer):
  its span starts under Strands' span, current then. A refused call's stream gives the refusal as the
  tool's failed result and ends; the tool never runs;
* runs each step of the tool's own stream with the hop's context attached, and detaches it before
  the step's event goes back to Strands: the hop's context never stays attached in the executor's
  context between steps, and never has to be detached from a finalizer in another one;
* at the tool's result, ends the hop (a handoff's stays open for its target: :mod:`._swarm`)
  and closes the tool's stream in the hop's context (Strands would leave it suspended until garbage
  collection), so its cleanup code runs inside the call.

The proxy is a ``wrapt`` object proxy: every attribute and ``isinstance`` still answer for the tool,
so Strands and other hooks and middleware see the tool they expect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Final

import wrapt
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from strands.types._events import ToolInterruptEvent
from strands.types.events import ToolResultEvent

from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation._base import PatchTarget
from otel_guard.instrumentation.strands._calls import hop_of, refused_result, with_refusal_text
from otel_guard.instrumentation.strands._scope import CALL, Call, SwarmRun, guarding
from otel_guard.instrumentation.strands._swarm import keep_handoff

INTERNAL_NAMES: Final[tuple[PatchTarget, ...]] = (("strands.types._events", "ToolInterruptEvent"),)
"""Strands names read here (not patched) that its public modules do not export."""

_LAST_EVENTS: Final = (ToolResultEvent, ToolInterruptEvent)
"""The events after which Strands reads no more of a tool's stream."""

if TYPE_CHECKING:
    _ToolProxy = wrapt.ObjectProxy[Any]
else:  # wrapt < 2 has no subscriptable proxy type
    _ToolProxy = wrapt.ObjectProxy


class ToolInHop(_ToolProxy):
    """The tool of a call of ``agent``'s, whose stream is the call's hop."""

    def __init__(self, tool: Any, agent: Any) -> None:
        super().__init__(tool)
        self._self_agent = agent

    def stream(self, tool_use: Any, invocation_state: dict[str, Any], **kwargs: Any) -> _StreamInHop:
        return _StreamInHop(self.__wrapped__, self._self_agent, tool_use, invocation_state, kwargs)


class _StreamInHop:
    """The tool's stream as a hop (an async iterator, not a generator: one left unfinished needs
    no finalizer to run in a context of its own)."""

    def __init__(
        self, tool: Any, agent: Any, tool_use: Any, invocation_state: dict[str, Any], kwargs: dict[str, Any]
    ) -> None:
        self._tool = tool
        self._agent = agent
        self._tool_use = tool_use
        self._invocation_state = invocation_state
        self._kwargs = kwargs
        self._started = False
        self._hop: Delegation | None = None  # None: the call is no hop (or its hop has ended)
        self._swarm_run: SwarmRun | None = None
        self._context: Context | None = None
        self._inner: AsyncIterator[Any] | None = None

    def __aiter__(self) -> _StreamInHop:
        return self

    async def __anext__(self) -> Any:
        if not self._started:
            self._started = True
            refused = await self._start()
            if refused is not None:
                return refused
        inner, ctx = self._inner, self._context
        if inner is None:
            raise StopAsyncIteration
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            event = await anext(inner)
            if isinstance(event, _LAST_EVENTS):
                event = self._ended_with(event)
                await self._close(inner)
            return event
        except BaseException as exc:
            self._end(None if isinstance(exc, StopAsyncIteration) else exc)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _start(self) -> Any:
        """Decide the call's hop (inside Strands' span of the call) and start the tool's stream in
        it; the refusal's result when the hop is refused."""
        target = (
            hop_of(self._tool, self._tool_use, self._invocation_state, self._agent) if guarding() else None
        )
        if target is not None:
            name, kind, self._swarm_run = target
            # A handoff passes control (the node handing off waits for nothing): a transfer.
            hop = delegate(name, kind=kind, transfer=self._swarm_run is not None)
            try:
                ctx = await hop.astart()
            except DelegationRefused as err:
                return refused_result(self._tool_use.get("toolUseId"), err)
            self._hop, self._context = hop, otel_context.set_value(CALL, Call(name, hop), ctx)
        token = otel_context.attach(self._context) if self._context is not None else None
        try:
            self._inner = aiter(self._tool.stream(self._tool_use, self._invocation_state, **self._kwargs))
        except BaseException as exc:
            self._end(exc)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
        return None

    def _ended_with(self, event: Any) -> Any:
        """The call's last event: a nested refusal's text put in; the hop ended (or kept open for
        the node a handoff hands off to)."""
        if not isinstance(event, ToolResultEvent):
            self._end(None)  # an interrupt: the call stops here
            return event
        event = with_refusal_text(event)
        hop, run = self._hop, self._swarm_run
        if hop is not None and run is not None and event.tool_result.get("status") == "success":
            self._hop = None
            keep_handoff(run, hop.hop.agent, hop)
        else:
            self._end(event.exception)
        return event

    def _end(self, exc: BaseException | None) -> None:
        hop, self._hop = self._hop, None
        if hop is not None:
            hop.finish(exc)

    async def aclose(self) -> None:
        """Close the tool's stream inside the hop's context (for a caller that stops early)."""
        inner, ctx = self._inner, self._context
        if inner is None:
            return
        token = otel_context.attach(ctx) if ctx is not None else None
        try:
            await self._close(inner)
        finally:
            self._end(None)
            if token is not None:
                otel_context.detach(token)

    async def _close(self, inner: AsyncIterator[Any]) -> None:
        self._inner = None
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()

    def __del__(self) -> None:
        # A stream abandoned mid-call (its task cancelled between two steps): the hop's span ends.
        self._end(None)
