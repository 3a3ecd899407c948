"""A guard's refusal answered by another service, read back into :class:`~otel_guard.DelegationRefused`.

A service under :class:`otel_guard.asgi.GuardMiddleware` answers a refused hop ``409`` with the JSON
body of :func:`otel_guard.asgi.refusal_body`. What a reader would not guess: only that exact shape
is read as a refusal (a 409 of the app's own, an A2A REST error, any other conflict stays an HTTP
response), and the body is read only when it is small: a refusal never holds more than a few
hundred bytes, and a client must not read a large body the app meant to stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from otel_guard.chain import Hop, name_problem
from otel_guard.errors import REASON_CODES, DelegationRefused

MAX_REFUSAL_BYTES: Final = 16384
"""The largest body read as a possible refusal; a longer 409 is left to the app."""

MAX_MESSAGE: Final = 1024
"""A remote refusal's message as the model will read it, cut to this many characters."""

MAX_NAME: Final = 256
"""The longest agent or skill name read from a refusal (the processor cuts names at the same length)."""


def _good_name(name: object) -> bool:
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME and name_problem(name) is None


def may_be_refusal(status: int, content_type: str | None, length: str | int | None) -> bool:
    """Whether a response may hold a guard's refusal, before its body is read: a 409 with a JSON
    body no longer than :data:`MAX_REFUSAL_BYTES` (or of unknown length, read up to that)."""
    if status != 409 or not content_type or not content_type.lower().startswith("application/json"):
        return False
    if length is None:
        return True
    try:
        return int(length) <= MAX_REFUSAL_BYTES
    except ValueError:
        return False


def remote_refusal(body: bytes, fallback_agent: Callable[[], str]) -> DelegationRefused | None:
    """The refusal ``body`` (a 409's) holds, or ``None`` when it is not a guard's refusal.

    ``fallback_agent`` names the refused hop when the body does not (an older guard's body has no
    ``agent``): the host that was called.
    """
    if len(body) > MAX_REFUSAL_BYTES:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    code, reason, message = data.get("error"), data.get("reason"), data.get("message")
    if not isinstance(code, str) or not isinstance(reason, str) or REASON_CODES.get(reason) != code:
        return None
    if not isinstance(message, str) or not message:
        return None
    agent, skill = data.get("agent"), data.get("skill")
    if not isinstance(agent, str) or not _good_name(agent):
        agent = fallback_agent() or "(unnamed service)"
    if not isinstance(skill, str) or not _good_name(skill):
        skill = None
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 1] + "…"
    return DelegationRefused(reason, message, Hop(agent, skill), None, remote=True)
