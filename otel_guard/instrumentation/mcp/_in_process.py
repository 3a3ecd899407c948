"""One process, both sides: an MCP call whose server runs in the caller's own context.

``mcp.Client(server)`` in its default mode connects through a ``DirectDispatcher``: no transport, no
JSON-RPC, the server's handler awaited by the caller itself, in the caller's context. There the
client's hop is already in force around the server's handler, so the server side has nothing to
read and nothing to decide again: the chain it would verify is the one this process decided a
moment earlier, in the same context. The client hands the hop over instead of writing it into
``_meta``, and the server, finding the very chain it was handed in force, runs the tool body inside
the client's hop. One call, one hop, one span (the CLIENT one; MCP's own ``tools/call`` server span
nests under it by the ambient context, as it does for any direct dispatch).

Every other pairing -- JSON-RPC over memory streams, stdio, HTTP, another process -- runs the server
in another context, never sees the handover, and reads ``_meta`` as before.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final

from opentelemetry.context import Context

from otel_guard.chain import Chain, ChainToken
from otel_guard.instrumentation.mcp._context import chain_value

try:  # where mcp 2.x keeps it; a version without it simply never hands over
    from mcp.shared.direct_dispatcher import DirectDispatcher as _DirectDispatcher
except ImportError:  # pragma: no cover - depends on the installed mcp
    _DirectDispatcher = None  # type: ignore[assignment,misc]

_DISPATCHER_ATTRIBUTE: Final = "_dispatcher"  # ClientSession's dispatcher (mcp 2.3); tested


class Handover:
    """A ``call_tool`` in flight whose server may run in this same context; ``taken`` once its server
    has taken it (a flag, not a new context: the body's own calls see it, and are new calls)."""

    __slots__ = ("_chain", "chain_value", "taken", "tool")

    def __init__(self, tool: str, chain_value: object, chain: Chain | None = None) -> None:
        self.tool = tool
        self.chain_value = chain_value  # the chain's baggage value in force for the call, by identity
        self._chain = chain  # None: the chain of chain_value, a token made here (read when needed)
        self.taken = False

    @property
    def chain(self) -> Chain | None:
        """The chain of the call's hop."""
        if self._chain is None and type(self.chain_value) is ChainToken:
            self._chain = self.chain_value.chain
        return self._chain


handed_over: ContextVar[Handover | None] = ContextVar("otel_guard_mcp_handed_over", default=None)
"""The call this context is making through a direct dispatcher (taken by its server or not yet)."""


def dispatches_directly(session: object) -> bool:
    """Whether ``session`` (a ``ClientSession``) awaits its server in the caller's own context."""
    if _DirectDispatcher is None:
        return False
    return isinstance(getattr(session, _DISPATCHER_ATTRIBUTE, None), _DirectDispatcher)


def take_over(tool: object, current: Context) -> bool:
    """Whether a server serving a call of ``tool`` in ``current``, the caller's context, takes it
    over (and marks it taken): not when no call was handed over here, when it was another tool's,
    when another chain is in force (a context the call did not come from), or when it was taken
    already (a request the body itself sends)."""
    handover = handed_over.get()
    if handover is None or handover.taken or handover.tool != tool:
        return False
    if chain_value(current) is not handover.chain_value:
        return False
    handover.taken = True
    return True


def serving_handed_over(chain: Chain) -> bool:
    """Whether this context runs the body of a handed-over call whose hop's chain is ``chain``."""
    handover = handed_over.get()
    return handover is not None and handover.taken and handover.chain == chain
