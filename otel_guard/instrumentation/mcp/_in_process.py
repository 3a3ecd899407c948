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
from typing import Any, Final

from opentelemetry.context import Context

from otel_guard.chain import Chain, ChainToken
from otel_guard.instrumentation.mcp._context import chain_value

try:  # where mcp 2.x keeps it; a version without it simply never hands over
    from mcp.shared.direct_dispatcher import DirectDispatcher as _DirectDispatcher
except ImportError:  # pragma: no cover - depends on the installed mcp
    _DirectDispatcher = None  # type: ignore[assignment,misc]

DISPATCHER_ATTRIBUTE: Final = "_dispatcher"  # ClientSession's dispatcher (mcp 2.3); tested
DIRECT_DISPATCHER: Final = _DirectDispatcher
"""The class whose sessions dispatch directly, or ``None`` (read inline by the client guard)."""


Handover = list[Any]
"""A ``call_tool`` in flight whose server may run in this same context: ``[tool, chain value, chain,
taken]`` (the indices below). The chain's baggage value in force for the call is compared by
identity; the chain is ``None`` for a new hop's handover (the chain of its token, read when needed);
``taken`` is set once the server has taken the call (a flag, not a new context: the body's own
calls see it, and are new calls). A list, not an instance: one is made on every in-process call,
and a list of four costs about a sixth of an instance of a class with slots (callgrind: 0.3 k
against 1.85 k)."""

TOOL: Final = 0
CHAIN_VALUE: Final = 1
CHAIN: Final = 2
TAKEN: Final = 3


handed_over: ContextVar[Handover | None] = ContextVar("otel_guard_mcp_handed_over", default=None)
"""The call this context is making through a direct dispatcher (taken by its server or not yet)."""


def dispatches_directly(session: object) -> bool:
    """Whether ``session`` (a ``ClientSession``) awaits its server in the caller's own context (the
    client guard reads the same inline, on every call)."""
    return DIRECT_DISPATCHER is not None and isinstance(
        getattr(session, DISPATCHER_ATTRIBUTE, None), DIRECT_DISPATCHER
    )


def take_over(tool: object, current: Context) -> bool:
    """Whether a server serving a call of ``tool`` in ``current``, the caller's context, takes it
    over (and marks it taken): not when no call was handed over here, when it was another tool's,
    when another chain is in force (a context the call did not come from), or when it was taken
    already (a request the body itself sends)."""
    handover = handed_over.get()
    if handover is None or handover[TAKEN] or handover[TOOL] != tool:
        return False
    if chain_value(current) is not handover[CHAIN_VALUE]:
        return False
    handover[TAKEN] = True
    return True


def serving_handed_over(chain: Chain) -> bool:
    """Whether this context runs the body of a handed-over call whose hop's chain is ``chain``."""
    handover = handed_over.get()
    if handover is None or not handover[TAKEN]:
        return False
    served = handover[CHAIN]
    if served is None and type(handover[CHAIN_VALUE]) is ChainToken:
        served = handover[CHAIN_VALUE].chain
    return bool(served == chain)
