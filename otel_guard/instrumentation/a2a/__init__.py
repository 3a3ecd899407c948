"""Guard A2A (``a2a-sdk``) clients and servers: a send is a hop, the server checks it again.

Switch it on with ``opentelemetry-instrument`` (extra ``a2a``), or in code:
``A2AInstrumentor().instrument()``.
A client send (JSON-RPC, HTTP+JSON or gRPC) is one CLIENT hop ``invoke_agent {card name}``, its chain
in the request's ``baggage``; the server checks it before the ``AgentExecutor`` runs, and a refusal
reaches an instrumented client as :class:`A2ADelegationRefused`, an ``A2AClientError``. Wire format,
error codes and limits: docs/runtimes/a2a.md.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Collection
from typing import Any, Final

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, unwrap_all
from otel_guard.instrumentation.a2a.package import _instruments

_log = logging.getLogger("otel_guard.instrumentation")

_CLIENT: Final = "otel_guard.instrumentation.a2a._client"
_SERVER: Final = "otel_guard.instrumentation.a2a._server"
_GRPC: Final = "otel_guard.instrumentation.a2a._grpc"
_V2: Final = "a2a.server.request_handlers.default_request_handler_v2"
_LEGACY: Final = "a2a.server.request_handlers.default_request_handler"

_PATCHES: Final[dict[PatchTarget, tuple[str, str]]] = {
    # client: the hop, and the two parsers that recognise a remote refusal
    ("a2a.client.base_client", "BaseClient.send_message"): (_CLIENT, "send_message"),
    ("a2a.client.transports.jsonrpc", "JsonRpcTransport._create_jsonrpc_error"): (
        _CLIENT,
        "create_jsonrpc_error",
    ),
    ("a2a.client.transports.rest", "_parse_rest_error"): (_CLIENT, "parse_rest_error"),
    # server: continue the caller's trace where the SDK starts its own server span
    ("a2a.server.routes.jsonrpc_dispatcher", "JsonRpcDispatcher.handle_requests"): (
        _SERVER,
        "continue_caller",
    ),
    ("a2a.server.routes.rest_dispatcher", "RestDispatcher.on_message_send"): (
        _SERVER,
        "continue_caller",
    ),
    ("a2a.server.routes.rest_dispatcher", "RestDispatcher.on_message_send_stream"): (
        _SERVER,
        "continue_caller",
    ),
    # server: the hop, before the executor runs
    (_V2, "DefaultRequestHandlerV2.on_message_send"): (_SERVER, "on_message_send"),
    (_V2, "DefaultRequestHandlerV2.on_message_send_stream"): (_SERVER, "on_message_send_stream"),
    (_LEGACY, "LegacyRequestHandler.on_message_send"): (_SERVER, "on_message_send"),
    (_LEGACY, "LegacyRequestHandler.on_message_send_stream"): (_SERVER, "on_message_send_stream"),
    # server: a refusal in the transport's own error shape
    ("a2a.server.routes.jsonrpc_dispatcher", "build_error_response"): (
        _SERVER,
        "build_error_response",
    ),
    ("a2a.utils.error_handlers", "build_rest_error_payload"): (_SERVER, "build_rest_error_payload"),
    # gRPC (only where grpcio is installed): a refusal as an ABORTED status, and back
    ("a2a.server.request_handlers.grpc_handler", "GrpcHandler.abort_context"): (
        _GRPC,
        "abort_context",
    ),
    # gRPC: no reply metadata carries the chain
    ("a2a.server.request_handlers.grpc_handler", "GrpcHandler._handle_unary"): (
        _GRPC,
        "serve_without_chain",
    ),
    ("a2a.server.request_handlers.grpc_handler", "GrpcHandler._handle_stream"): (
        _GRPC,
        "serve_without_chain",
    ),
    ("a2a.client.transports.grpc", "_map_grpc_error"): (_GRPC, "map_grpc_error"),
}

PATCH_TARGETS: Final[tuple[PatchTarget, ...]] = tuple(_PATCHES)
"""Every (module, attribute) this instrumentor wraps, where the SDK looks it up."""

"""The a2a-sdk versions this instrumentor is tested with."""


class A2AInstrumentor(GuardInstrumentor):
    """Makes every A2A send a guarded hop and checks the chain on every A2A server."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        import wrapt

        from otel_guard.instrumentation.a2a._hop import switch

        self._patched: list[PatchTarget] = []
        for (module, attribute), (wrapper_module, wrapper_name) in _PATCHES.items():
            try:
                wrapper = getattr(importlib.import_module(wrapper_module), wrapper_name)
                wrapt.wrap_function_wrapper(module, attribute, wrapper)
                self._patched.append((module, attribute))
            except ImportError as exc:
                # An optional part of the SDK that is not installed (grpcio, the HTTP server).
                _log.debug("otel-guard: A2A patch %s.%s skipped: %s", module, attribute, exc)
            except AttributeError:
                _log.warning(
                    "otel-guard: A2A patch target %s.%s does not exist in this a2a-sdk; "
                    "that part of A2A is not guarded",
                    module,
                    attribute,
                )
        switch.active = True

    def _uninstrument(self, **kwargs: Any) -> None:
        from otel_guard.instrumentation.a2a._hop import switch

        switch.active = False
        unwrap_all(getattr(self, "_patched", ()))
        self._patched = []


def __getattr__(name: str) -> Any:
    # The error class subclasses the SDK's A2AClientError, so it exists only where a2a-sdk does.
    if name in ("A2ADelegationRefused", "JSONRPC_REFUSED_CODE"):
        return getattr(importlib.import_module("otel_guard.instrumentation.a2a._errors"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
