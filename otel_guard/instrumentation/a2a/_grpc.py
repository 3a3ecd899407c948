"""A refused A2A hop over gRPC: the status the caller gets, and the error the client raises.

A reply never carries the chain: every call the SDK's ``GrpcHandler`` serves gets its
``ServicerContext`` through :class:`ReplyWithoutChain`, which takes the ``otel_guard.chain`` member out
of the ``baggage`` entries of the reply's initial and trailing metadata (the other members stay), as
the HTTP transports do with their response headers.

The server aborts the call with status ``ABORTED`` (the gRPC status Google maps to HTTP 409) and the
refusal as message, with the same ``google.rpc.ErrorInfo`` detail as the HTTP transports (domain
``otel-guard``, metadata ``code``, ``reason``, ``status``, ``retryable``, ``agent``, ``skill``) in the
``grpc-status-details-bin`` trailer, the way the SDK details its own errors. The instrumented client
raises it as :class:`~otel_guard.instrumentation.a2a._errors.A2ADelegationRefused`.

Imported only where ``grpcio`` is installed (the SDK's ``grpc`` extra).
"""

from __future__ import annotations

from typing import Any

import grpc
from a2a.utils.grpc_status import status_from_call, status_to_grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard._carriers import baggage_without_chain
from otel_guard.instrumentation.a2a._errors import (
    ERROR_DOMAIN,
    ERROR_INFO_TYPE,
    A2ADelegationRefused,
    ServerRefusal,
    error_metadata,
    refusal_from_details,
)
from otel_guard.instrumentation.a2a._hop import switch

STATUS = grpc.StatusCode.ABORTED


def metadata_without_chain(metadata: Any) -> Any:
    """gRPC metadata with the chain taken out of every ``baggage`` entry (dropped if nothing is left)."""
    if not metadata or not any(key.lower() == "baggage" for key, _ in metadata):
        return metadata
    kept: list[tuple[str, str | bytes]] = []
    for key, value in metadata:
        if key.lower() != "baggage":
            kept.append((key, value))
        elif rest := baggage_without_chain(value.decode("latin-1") if isinstance(value, bytes) else value):
            kept.append((key, rest))
    return tuple(kept)


class ReplyWithoutChain:
    """A call's ``grpc.aio.ServicerContext`` whose reply metadata never carries the chain.

    Everything but the three ways a handler sets reply metadata is the call's own context.
    """

    __slots__ = ("_context",)

    def __init__(self, context: Any) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def send_initial_metadata(self, initial_metadata: Any) -> None:
        await self._context.send_initial_metadata(metadata_without_chain(initial_metadata))

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._context.set_trailing_metadata(metadata_without_chain(trailing_metadata))

    async def abort(self, code: Any, details: str = "", trailing_metadata: Any = ()) -> Any:
        return await self._context.abort(code, details, metadata_without_chain(trailing_metadata))


def serve_without_chain(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Patch of ``GrpcHandler._handle_unary`` / ``_handle_stream(request, context, ...)``: the call
    runs with its context behind :class:`ReplyWithoutChain`."""
    if not is_instrumentation_enabled():
        return wrapped(*args, **kwargs)
    if len(args) > 1:
        args = (args[0], ReplyWithoutChain(args[1]), *args[2:])
    elif "context" in kwargs:
        kwargs = {**kwargs, "context": ReplyWithoutChain(kwargs["context"])}
    return wrapped(*args, **kwargs)


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
