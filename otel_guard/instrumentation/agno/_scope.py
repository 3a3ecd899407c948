"""Where an Agno call stands: what the guard keeps in the OpenTelemetry context.

A tool call puts a :class:`Call` in the context it runs in: an agent run of the same name inside it
is that call (one hop), and a run refused inside it leaves its refusal there, so the call's error
result carries the refusal's text. A team leader's delegation tool (``delegate_task_to_member``)
puts how the member runs: handed control (a transfer: route mode, or ``respond_directly``) or
called (the leader waits for the answer: coordinate, collaborate).
"""

from __future__ import annotations

from typing import Final

from opentelemetry import context as otel_context

from otel_guard.errors import DelegationRefused

CALL: Final = otel_context.create_key("otel_guard_agno_call")
"""Context key: the :class:`Call` whose body runs here (``None`` once an agent run starts)."""


TEAM: Final = otel_context.create_key("otel_guard_agno_team")
"""Context key: the team whose leader's run this is (``None`` inside an agent's run)."""


class Call:
    """A tool call in progress: its name, whether it hands control over, and a refusal inside it."""

    __slots__ = ("name", "refusal", "transfer")

    def __init__(self, name: str | None, transfer: bool = False) -> None:
        self.name = name  # None: a team's delegation tool, no hop of its own
        self.transfer = transfer
        self.refusal: DelegationRefused | None = None


def call_in_progress() -> Call | None:
    found = otel_context.get_value(CALL)
    return found if isinstance(found, Call) else None
