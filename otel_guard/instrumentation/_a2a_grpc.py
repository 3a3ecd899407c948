"""A refused A2A hop over gRPC: the status the caller gets, and the error the client raises.

The server aborts the call with status ``ABORTED`` (the gRPC status Google maps to HTTP 409) and the
refusal as message, with the same ``google.rpc.ErrorInfo`` detail as the HTTP transports (domain
``otel-guard``, metadata ``code``, ``reason``, ``status``, ``retryable``, ``agent``, ``skill``) in the
``grpc-status-details-bin`` trailer, the way the SDK details its own errors. The instrumented client
raises it as :class:`~otel_guard.instrumentation._a2a_errors.A2ADelegationRefused`.

Imported only where ``grpcio`` is installed (the SDK's ``grpc`` extra).
"""

from __future__ import annotations

from typing import Any

import grpc
from a2a.utils.grpc_status import status_from_call, status_to_grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard.instrumentation._a2a_errors import (
    ERROR_DOMAIN,
    ERROR_INFO_TYPE,
    A2ADelegationRefused,
    ServerRefusal,
    error_metadata,
    refusal_from_details,
)
from otel_guard.instrumentation._a2a_hop import switch

STATUS = grpc.StatusCode.ABORTED


async def abort_context(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Patch of ``GrpcHandler.abort_context(error, context)``: abort a refused hop as ABORTED."""
    error = args[0] if args else kwargs.get("error")
    if not is_instrumentation_enabled() or not isinstance(error, ServerRefusal):
        await wrapped(*args, **kwargs)
        return
    context = args[1] if len(args) > 1 else kwargs["context"]
    refusal = error.refusal
    detail = any_pb2.Any()
    detail.Pack(
        error_details_pb2.ErrorInfo(
            reason=refusal.code.upper(), domain=ERROR_DOMAIN, metadata=error_metadata(refusal)
        )
    )
    status = status_pb2.Status(code=STATUS.value[0], message=str(refusal), details=[detail])
    rich = status_to_grpc(status)
    context.set_trailing_metadata(tuple(context.trailing_metadata() or ()) + rich.trailing_metadata)
    await context.abort(rich.code, rich.details)


def _refusal_in(error: Any) -> A2ADelegationRefused | None:
    try:
        status = status_from_call(error)
    except ValueError:  # a trailer that does not match the call: not ours to read
        return None
    if status is None:
        return None
    details = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            details.append(
                {
                    "@type": ERROR_INFO_TYPE,
                    "reason": info.reason,
                    "domain": info.domain,
                    "metadata": dict(info.metadata),
                }
            )
    return refusal_from_details(status.message, details)


def map_grpc_error(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Patch of the gRPC client's ``_map_grpc_error(e)``: raise a refusal as A2ADelegationRefused."""
    if switch.active and is_instrumentation_enabled():
        error = args[0] if args else kwargs.get("e")
        refusal = _refusal_in(error)
        if refusal is not None:
            raise refusal from error
    return wrapped(*args, **kwargs)
