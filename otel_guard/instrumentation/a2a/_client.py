"""The A2A client side: a send is a hop into the remote agent, and the chain travels in its headers.

``BaseClient.send_message`` (streaming or not, every transport) becomes a hop ``invoke_agent {card
name}`` of kind CLIENT (a remote agent's invocation), with the A2A attributes of the request. Inside the
hop the current context (the new chain as W3C baggage, and the ``traceparent`` of the hop span) is
injected by the global propagator into the call's ``ClientCallContext.service_parameters``, which the
SDK sends as HTTP headers (JSON-RPC, HTTP+JSON) or gRPC metadata. The SDK's own transport span nests
under the hop span.

A refusal raises :class:`A2ADelegationRefused` from the first step of the send, before any request
leaves the process; a refusal from the remote agent (its JSON-RPC or HTTP+JSON error) is raised as
the same class by the two error parsers patched here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from a2a.client.client import ClientCallContext
from opentelemetry import baggage, propagate
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.trace import SpanKind

from otel_guard.guard import delegate
from otel_guard.instrumentation.a2a._errors import (
    JSONRPC_REFUSED_CODE,
    A2ADelegationRefused,
    refusal_from_details,
)
from otel_guard.instrumentation.a2a._hop import (
    SEND_MESSAGE,
    SEND_STREAMING_MESSAGE,
    hop_attributes,
    hop_skill,
    hop_stream,
    switch,
)
from otel_guard.telemetry import CHAIN_BAGGAGE_KEY

_BAGGAGE_ONLY = W3CBaggagePropagator()
_BAGGAGE_HEADER = "baggage"


def _enabled() -> bool:
    return switch.active and is_instrumentation_enabled()


def _propagating(call_context: ClientCallContext | None) -> ClientCallContext:
    """A copy of ``call_context`` whose service parameters carry the current context.

    The chain goes into the ``baggage`` header even when ``OTEL_PROPAGATORS`` leaves baggage out:
    without it a loop through A2A would go unseen.
    """
    carrier: dict[str, str] = dict(call_context.service_parameters or {}) if call_context else {}
    propagate.inject(carrier)
    if CHAIN_BAGGAGE_KEY not in carrier.get(_BAGGAGE_HEADER, "") and baggage.get_baggage(CHAIN_BAGGAGE_KEY):
        _BAGGAGE_ONLY.inject(carrier)
    if call_context is None:
        return ClientCallContext(service_parameters=carrier)
    return call_context.model_copy(update={"service_parameters": carrier})


def send_message(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> AsyncIterator[Any]:
    """Patch of ``BaseClient.send_message(request, *, context=None)``: one hop per send."""
    if not _enabled():
        stream: AsyncIterator[Any] = wrapped(*args, **kwargs)
        return stream
    request = args[0] if args else kwargs["request"]
    card = instance._card

    def open_stream() -> AsyncIterator[Any]:
        opened: AsyncIterator[Any] = wrapped(
            *args, **{**kwargs, "context": _propagating(kwargs.get("context"))}
        )
        return opened

    if not card.name:
        # A card without a name (a bootstrap card) cannot name the hop: carry the chain as it is
        # and let the server, which knows its own name, decide.
        return open_stream()
    streaming = instance._config.streaming and card.capabilities.streaming
    url = getattr(instance._transport, "url", None)
    attributes = hop_attributes(
        card,
        request,
        SEND_STREAMING_MESSAGE if streaming else SEND_MESSAGE,
        url if isinstance(url, str) else None,
    )
    hop = delegate(card.name, hop_skill(card, request), span_kind=SpanKind.CLIENT, attributes=attributes)
    return hop_stream(hop, A2ADelegationRefused.from_refusal, open_stream)


def create_jsonrpc_error(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Exception:
    """Patch of ``JsonRpcTransport._create_jsonrpc_error(error_dict)``: recognise a refusal."""
    if _enabled():
        error = args[0] if args else kwargs.get("error_dict")
        if isinstance(error, dict) and error.get("code") == JSONRPC_REFUSED_CODE:
            refusal = refusal_from_details(error.get("message", ""), error.get("data"))
            if refusal is not None:
                return refusal
    created: Exception = wrapped(*args, **kwargs)
    return created


def parse_rest_error(
    wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Exception | None:
    """Patch of ``rest._parse_rest_error(error_payload, fallback_message)``: recognise a refusal."""
    if _enabled():
        payload = args[0] if args else kwargs.get("error_payload")
        error = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(error, dict):
            refusal = refusal_from_details(error.get("message", ""), error.get("details"))
            if refusal is not None:
                return refusal
    parsed: Exception | None = wrapped(*args, **kwargs)
    return parsed
