"""The processor's one memory budget (``max_pending_bytes``) split between its two receivers, and
the room each keeps for the largest request it refused: no sender is ever held, and none is kept
refused for ever.

- **A share per protocol.** With OTLP/HTTP listening, each receiver's requests -- from their first
  byte, through inflation and OTLP/JSON conversion, until answered and detected, the forwarder's
  copy too -- hold at most :data:`PROTOCOL_SHARE` (¾) of the budget, so the other always has its
  quarter: a flood of OTLP/JSON (14 times its body while it converts) cannot keep every gRPC
  sender refused, nor gRPC every HTTP one. A quarter of the default 128 MiB is 32 MiB: four of
  the Collector's default 4 MiB batches forwarded (each held twice over while it is sent), eight
  being received; three quarters (96 MiB) hold the ten a Collector's exporter sends at once by
  default. A gRPC connection's calls being read keep their own cap of half the whole budget.
- **Room kept for the largest refused request** (the engine's ``KeptRoom``): once a request is
  refused, a request smaller as sent is refused when it would leave less than the room it wanted
  free, until a request as large comes (its retry) or :func:`keep_for` passes.

What a reader would not guess: a request larger than its share (at the defaults only an OTLP/JSON
body over 6.4 MiB) is taken only when nothing else at all is held and the other receiver refused
no request within :func:`keep_for` -- the engine's rule that a request alone is always taken, held
back while the other side waits, so the two take turns. Without OTLP/HTTP, gRPC's share is the
whole budget. The whole budget itself keeps no room: the forwarder draws from it for copies it
makes only when there is room (a join), and nobody comes back for one it could not make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from otel_guard_processor._engine import MemoryBudget

__all__ = ["PROTOCOL_SHARE", "Budgets", "keep_for", "split"]

PROTOCOL_SHARE: Final = Fraction(3, 4)
"""The most of the budget one receiver's requests hold while the other receiver listens."""
CONNECTION_SHARE: Final = Fraction(1, 2)
"""The most of the budget one gRPC connection's calls being read hold."""
KEEP_SLACK: Final = 1.0
"""Seconds a kept room waits past two retry delays for its request to come back."""


@dataclass(frozen=True)
class Budgets:
    """The whole budget and what each receiver draws from (``http`` None: no OTLP/HTTP)."""

    whole: MemoryBudget
    grpc: MemoryBudget
    http: MemoryBudget | None
    max_connection_bytes: int

    def kept_counts(self) -> dict[tuple[str, str], int]:
        """What the receivers' kept rooms counted, ever: ``(share, outcome)`` -> count."""
        shares = (("grpc", self.grpc), ("http", self.http))
        return {
            (name, outcome): count
            for name, budget in shares
            if budget is not None
            for outcome, count in budget.kept_counts.items()
        }


def keep_for(retry_after: float) -> float:
    """How long a refused request's room is kept: twice the retry delay an OTLP/HTTP client is
    told (``Retry-After`` is whole seconds, at least 1) and :data:`KEEP_SLACK`, so a client that
    retries as told is back well within it, and one that never comes back frees it."""
    return 2 * max(1, math.ceil(retry_after)) + KEEP_SLACK


def split(max_pending_bytes: int, retry_after: float, *, http: bool) -> Budgets:
    """The budget of ``max_pending_bytes``, shared out as the module docstring says."""
    keep = keep_for(retry_after)
    connection = max(1, int(max_pending_bytes * CONNECTION_SHARE))
    whole = MemoryBudget(max_pending_bytes)
    if not http:
        return Budgets(whole, whole.share(max_pending_bytes, keep_for=keep), None, connection)
    share = max(1, int(max_pending_bytes * PROTOCOL_SHARE))
    return Budgets(
        whole,
        whole.share(share, keep_for=keep),
        whole.share(share, keep_for=keep),
        connection,
    )
