"""The one exception users catch.

::

    RecursionError
      └── DelegationRefused     a hop was refused before it ran (status 409, never retryable)

``DelegationRefused`` subclasses ``RecursionError`` so code that already guards against runaway recursion
catches it too. Its ``code`` is what an A2A gateway or HTTP agent puts on the wire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from otel_guard.chain import Chain, Hop

REASON_CODES: Final[dict[str, str]] = {
    "cycle": "a2a_delegation_cycle",
    "depth": "a2a_delegation_depth",
    "name_depth": "a2a_delegation_depth",
    "chain_size": "a2a_delegation_depth",
    "observe_ceiling": "a2a_delegation_depth",
    "expired": "a2a_delegation_invalid",
    "bad_signature": "a2a_delegation_invalid",
    "foreign_workspace": "a2a_delegation_invalid",
    "budget": "a2a_delegation_budget",
}
"""Refusal reason -> wire error code (docs/spec.md §1, §3)."""


class DelegationRefused(RecursionError):
    """A delegation hop was refused before its body ran.

    Retrying cannot help: the same chain is refused the same way every time, so the caller should
    answer with what it has. ``str(err)`` names the agent and the path that led to it. ``remote``
    says whether another process refused the hop (its answer arrived here): a remote refusal names
    the refused hop but carries no chain, which travels only as the signed token.
    """

    status: Final = 409
    retryable: Final = False

    def __init__(
        self, reason: str, message: str, hop: Hop, chain: Chain | None, *, remote: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.hop = hop
        self.chain = chain
        self.remote = remote

    @property
    def code(self) -> str:
        return REASON_CODES.get(self.reason, "a2a_delegation_invalid")

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuilt, (type(self), self.reason, str(self), self.hop, self.chain, self.remote))


def _rebuilt(
    cls: type[DelegationRefused], reason: str, message: str, hop: Hop, chain: Chain | None, remote: bool
) -> DelegationRefused:
    """A pickled refusal made again (a refusal crosses a process pool as any exception does)."""
    return cls(reason, message, hop, chain, remote=remote)
