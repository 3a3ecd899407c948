"""The A2A server side: the incoming chain is checked before the agent executor runs.

Two layers, because the SDK has two:

- The HTTP dispatchers (``JsonRpcDispatcher.handle_requests``, ``RestDispatcher.on_message_send`` and
  ``on_message_send_stream``) continue the caller's context from the request headers before the SDK
  opens its own server span, so that span and ours join the caller's trace. An OpenTelemetry ASGI
  middleware that already did this is left alone. The response they return never carries the chain
  in its ``baggage`` header.
- The request handlers' ``on_message_send`` and ``on_message_send_stream`` (``DefaultRequestHandler``,
  which is ``DefaultRequestHandlerV2``, and ``LegacyRequestHandler``) run the hop
  ``delegate(card name, skill, receiving=True)`` around the call: an INTERNAL ``invoke_agent``
  span (the agent runs in this process) under the SDK's own SERVER span of the request. The executor's
  task is started inside the hop, so it runs under the new chain and its own A2A calls carry it. When
  no dispatcher layer ran (gRPC, a custom route), the hop reads the caller's headers (or gRPC
  metadata) from the ``ServerCallContext`` itself.

A refused hop raises :class:`ServerRefusal` before the handler runs, so no task is created and the
executor never runs; the patched formatters turn it into the transport's error (see
``_errors``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from otel_guard._carriers import attach_caller_context, carrier_from_headers, headers_without_chain
from otel_guard.guard import Delegation, delegate
from otel_guard.instrumentation.a2a._errors import (
    ServerRefusal,
    jsonrpc_error_response,
    rest_error_payload,
)
from otel_guard.instrumentation.a2a._hop import (
    SEND_MESSAGE,
    SEND_STREAMING_MESSAGE,
    hop_attributes,
    hop_call,
    hop_skill,
    hop_stream,
    switch,
)


def _enabled() -> bool:
    return switch.active and is_instrumentation_enabled()


# -- the dispatchers: continue the caller's trace -------------------------------------------------


async def continue_caller(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Patch of the HTTP dispatch methods ``(self, request)``: run them in the caller's context."""
    if not _enabled():
        return await wrapped(*args, **kwargs)
    request = args[0] if args else kwargs["request"]
    token = attach_caller_context(lambda: carrier_from_headers(request.scope.get("headers") or ()))
    try:
        response = await wrapped(*args, **kwargs)
    finally:
        if token is not None:
            otel_context.detach(token)
    return _without_chain(response)


def _without_chain(response: Any) -> Any:
    """The dispatcher's Starlette response with the chain out of every ``baggage`` header: a reply
    never carries the chain (:func:`otel_guard._carriers.headers_without_chain`, as the middleware does)."""
    raw_headers = getattr(response, "raw_headers", None)
    if isinstance(raw_headers, list) and any(name.lower() == b"baggage" for name, _ in raw_headers):
        response.raw_headers = headers_without_chain(raw_headers)
    return response


# -- the request handlers: the hop ---------------------------------------------------------------


def _caller_carrier(call_context: Any) -> dict[str, str] | None:
    """The caller's headers (HTTP) or metadata (gRPC) that the SDK kept in the call context."""
    state = getattr(call_context, "state", None)
    if not isinstance(state, Mapping):
        return None
    headers = state.get("headers")
    if isinstance(headers, Mapping):
        return {str(name).lower(): str(value) for name, value in headers.items()}
    grpc_context = state.get("grpc_context")
    if grpc_context is not None:
        # Repeated keys (two ``baggage`` entries) are joined as repeated HTTP headers are, within
        # the same baggage limit; binary (``-bin``) values are not text and are left out.
        metadata = grpc_context.invocation_metadata() or ()
        return carrier_from_headers(
            (str(key).encode("latin-1", "replace"), value.encode("latin-1", "replace"))
            for key, value in metadata
            if isinstance(value, str)
        )
    return None


def _hop_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(params, context)`` of ``on_message_send(params, context)``."""
    params = args[0] if args else kwargs["params"]
    call_context = args[1] if len(args) > 1 else kwargs.get("context")
    return params, call_context


def _received(card: Any, params: Any, method: str) -> Delegation:
    """The hop of a request received for the agent ``card`` describes: the agent runs here, so its
    span is INTERNAL, under the SDK's SERVER span of the request."""
    attributes = hop_attributes(card, params, method)
    return delegate(card.name, hop_skill(card, params), receiving=True, attributes=attributes)


async def on_message_send(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Patch of ``on_message_send(params, context)``: the executor runs inside the hop."""
    card = getattr(instance, "_agent_card", None) if _enabled() else None
    if card is None or not card.name:
        return await wrapped(*args, **kwargs)
    params, call_context = _hop_arguments(args, kwargs)
    hop = _received(card, params, SEND_MESSAGE)
    return await hop_call(hop, ServerRefusal, lambda: wrapped(*args, **kwargs), _caller_carrier(call_context))


def on_message_send_stream(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """Patch of ``on_message_send_stream(params, context)``: the stream runs inside the hop."""
    card = getattr(instance, "_agent_card", None) if _enabled() else None
    if card is None or not card.name:
        stream: AsyncIterator[Any] = wrapped(*args, **kwargs)
        return stream
    params, call_context = _hop_arguments(args, kwargs)
    hop = _received(card, params, SEND_STREAMING_MESSAGE)
    return hop_stream(hop, ServerRefusal, lambda: wrapped(*args, **kwargs), _caller_carrier(call_context))


# -- the error formatters ------------------------------------------------------------------------


def build_error_response(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Patch of ``build_error_response(request_id, error)`` as the JSON-RPC dispatcher uses it."""
    error = args[1] if len(args) > 1 else kwargs.get("error")
    if is_instrumentation_enabled() and isinstance(error, ServerRefusal):
        request_id = args[0] if args else kwargs.get("request_id")
        return jsonrpc_error_response(request_id, error.refusal)
    response: dict[str, Any] = wrapped(*args, **kwargs)
    return response


def build_rest_error_payload(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Patch of ``build_rest_error_payload(error)``: its ``code`` is also the HTTP status sent."""
    error = args[0] if args else kwargs.get("error")
    if is_instrumentation_enabled() and isinstance(error, ServerRefusal):
        return rest_error_payload(error.refusal)
    payload: dict[str, Any] = wrapped(*args, **kwargs)
    return payload
