"""otel-guard: stop AI agents from delegating in loops, and see every loop in OpenTelemetry.

Every delegation hop carries a signed chain (who called whom, for which job) in W3C Baggage. Before a
hop runs, the guard refuses it if its target already stands in the chain (a cycle), if the chain is
too deep, if one name stands in it too often, or if the chain was altered, has expired or comes from
another workspace. Every hop is a span with the chain and the decision on it::

    import otel_guard

    @otel_guard.agentic
    def planner(task: str) -> str:
        ...

    with otel_guard.delegate("budget", "price"):
        ...

Settings come from ``OTEL_GUARD_*`` environment variables or :func:`configure`; see the README.
"""

from otel_guard.agentic import agentic
from otel_guard.chain import Chain, Hop
from otel_guard.errors import DelegationRefused
from otel_guard.guard import Delegation, current_chain, delegate, name_depth
from otel_guard.prompt import situational_prefix
from otel_guard.settings import Settings, configure

__all__ = [
    "Chain",
    "Delegation",
    "DelegationRefused",
    "Hop",
    "Settings",
    "agentic",
    "configure",
    "current_chain",
    "delegate",
    "name_depth",
    "situational_prefix",
]
