"""A refused A2A hop on the wire and in the caller's hands.

The server answers a refused hop before the agent executor runs, in the shape of the transport:

- JSON-RPC: an error object with code ``-32099`` (an implementation-defined server error; A2A's own
  codes are ``-32001`` upwards), ``message`` = the refusal, and ``data`` = a ``google.rpc.ErrorInfo``
  the way A2A details its own errors::

      {"code": -32099, "message": "Delegation cycle: agent planner is already in chain planner → budget",
       "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                 "reason": "A2A_DELEGATION_CYCLE", "domain": "otel-guard",
                 "metadata": {"code": "a2a_delegation_cycle", "reason": "cycle", "status": "409",
                              "retryable": "false", "agent": "planner", "skill": "itinerary"}}]}

- HTTP+JSON (REST): HTTP status 409 and ``{"error": {"code": 409, "status": "ABORTED", "message":
  ..., "details": [<the same ErrorInfo>]}}`` (``ABORTED`` is the gRPC status Google maps to 409).

The instrumented client turns either back into :class:`A2ADelegationRefused`, and raises the same
class when it refuses a hop itself before sending. It is both an ``A2AClientError`` (so A2A code that
handles the SDK's errors handles it) and a :class:`~otel_guard.DelegationRefused` (so code and other
runtime adapters that know the guard see a refusal, with ``code``, ``reason``, ``status == 409`` and
``retryable is False``). The chain itself (the token) never appears in an error.
"""

from __future__ import annotations

from typing import Any, Final

from a2a.client.errors import A2AClientError
from a2a.utils.errors import A2AError

from otel_guard.chain import Chain, Hop
from otel_guard.errors import DelegationRefused

JSONRPC_REFUSED_CODE: Final = -32099
"""The JSON-RPC error code of a refused hop."""

ERROR_INFO_TYPE: Final = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN: Final = "otel-guard"
REST_STATUS: Final = "ABORTED"


class A2ADelegationRefused(DelegationRefused, A2AClientError):
    """An A2A send refused by otel-guard, by this process before sending or by the remote agent.

    ``remote`` says which. A remote refusal carries the refused hop but not the chain (``chain`` is
    ``None``): the chain travels only as the signed token, which no error repeats.
    """

    def __init__(
        self, reason: str, message: str, hop: Hop, chain: Chain | None, *, remote: bool = False
    ) -> None:
        DelegationRefused.__init__(self, reason, message, hop, chain, remote=remote)
        # A2AError's own fields (its __init__ is not on this MRO path).
        self.message = message
        self.data = error_metadata(self)

    @classmethod
    def from_refusal(cls, err: DelegationRefused) -> A2ADelegationRefused:
        return cls(err.reason, str(err), err.hop, err.chain)


class ServerRefusal(A2AError):
    """Raised by the server patch instead of running the executor; the transport formats it."""

    def __init__(self, refusal: DelegationRefused) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal
        self.code = refusal.code  # what the SDK's error log prints as the error's code


def error_metadata(err: DelegationRefused) -> dict[str, str]:
    """The ``ErrorInfo`` metadata of a refusal (string values, as ``google.rpc.ErrorInfo`` requires)."""
    return {
        "code": err.code,
        "reason": err.reason,
        "status": str(err.status),
        "retryable": "false",
        "agent": err.hop.agent,
        "skill": err.hop.skill or "",
    }


def error_info(err: DelegationRefused) -> dict[str, Any]:
    return {
        "@type": ERROR_INFO_TYPE,
        "reason": err.code.upper(),
        "domain": ERROR_DOMAIN,
        "metadata": error_metadata(err),
    }


def jsonrpc_error_response(request_id: str | int | None, err: DelegationRefused) -> dict[str, Any]:
    """A whole JSON-RPC 2.0 error response for a refused hop."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {"code": JSONRPC_REFUSED_CODE, "message": str(err), "data": [error_info(err)]},
    }


def rest_error_payload(err: DelegationRefused) -> dict[str, Any]:
    """The HTTP+JSON error body for a refused hop (sent with HTTP status 409)."""
    return {
        "error": {
            "code": err.status,
            "status": REST_STATUS,
            "message": str(err),
            "details": [error_info(err)],
        }
    }


def refusal_from_details(message: object, details: object) -> A2ADelegationRefused | None:
    """The refusal that an error's typed details describe, or ``None`` if they describe none."""
    if not isinstance(details, list):
        return None
    for detail in details:
        if (
            isinstance(detail, dict)
            and detail.get("@type") == ERROR_INFO_TYPE
            and detail.get("domain") == ERROR_DOMAIN
        ):
            metadata = detail.get("metadata")
            if not isinstance(metadata, dict):
                return None
            reason, agent, skill = (metadata.get(k) for k in ("reason", "agent", "skill"))
            if not isinstance(reason, str) or not isinstance(agent, str) or not reason or not agent:
                return None  # malformed: the SDK's own error (with the message) is raised instead
            hop = Hop(agent, skill if isinstance(skill, str) and skill else None)
            return A2ADelegationRefused(reason, str(message), hop, None, remote=True)
    return None
