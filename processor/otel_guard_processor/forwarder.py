"""Forwarding requests downstream, byte for byte, and turning its failures into retryable answers.

Every signal goes the same way, each to its own Export method on one channel, within one
``max_inflight``: traces, and the metrics and logs the processor passes on unread.

The processor never re-encodes a request: the bytes it received over OTLP/gRPC or OTLP/HTTP
protobuf are the bytes it sends (an OTLP/JSON request is sent in its protobuf encoding). The client
is acknowledged only after the downstream acknowledged, with the downstream's own response (so a
``partial_success`` reaches the client unchanged).

When the downstream cannot take the request the client is told to retry, as the OpenTelemetry
Collector's exporters expect, so their retry and sending queue keep the data:

==========================================  =====================  ==========
what happened                               gRPC status            HTTP
==========================================  =====================  ==========
downstream unreachable or UNAVAILABLE       UNAVAILABLE            503
downstream slower than ``forward_timeout``  RESOURCE_EXHAUSTED     429
``max_inflight`` requests already waiting   RESOURCE_EXHAUSTED     429
downstream said RESOURCE_EXHAUSTED          RESOURCE_EXHAUSTED     429
downstream said anything else               the same status        mapped
==========================================  =====================  ==========

Retryable answers carry a ``google.rpc.RetryInfo`` detail (gRPC) or ``Retry-After`` (HTTP) of
``retry_after`` seconds: the Collector retries RESOURCE_EXHAUSTED only when it carries one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import grpc.aio

from otel_guard_processor.signals import UNREAD

__all__ = ["EXPORT_METHOD", "METHODS", "DownstreamError", "Forwarder"]

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# Every signal's Export: traces, and the metrics and logs passed on unread (signals.py).
METHODS = (EXPORT_METHOD, *(signal.method for signal in UNREAD))


@dataclass
class DownstreamError(Exception):
    """The downstream did not acknowledge a request: the status to answer the client with."""

    code: grpc.StatusCode
    details: str
    retryable: bool
    reason: str  # for the downstream_errors metric: the status name, or busy / timeout

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class Forwarder:
    """One gRPC channel to the downstream, with a bound on requests in flight."""

    def __init__(self, target: str, *, timeout: float, max_inflight: int, max_message_bytes: int) -> None:
        self.target = target
        self._timeout = timeout
        self._max_inflight = max_inflight
        self._inflight = 0
        self._channel = grpc.aio.insecure_channel(
            target,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                # Reconnect soon after the downstream comes back: clients are retrying meanwhile.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 5000),
            ],
        )
        # No (de)serializers: requests and responses pass as the bytes they are.
        self._exports = {
            method: self._channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            for method in METHODS
        }

    @property
    def inflight(self) -> int:
        return self._inflight

    def busy(self) -> DownstreamError | None:
        """The refusal :meth:`start` would raise now (``max_inflight`` requests already waiting),
        else None: nothing changes between this and a ``start`` with no ``await`` between them."""
        if self._inflight < self._max_inflight:
            return None
        return DownstreamError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{self._inflight} requests already waiting for the downstream {self.target}",
            retryable=True,
            reason="busy",
        )

    def start(self, raw: bytes, method: str = EXPORT_METHOD) -> asyncio.Future[bytes]:
        """Start sending ``raw`` to ``method`` (one of METHODS); the future gives the downstream's
        response bytes.

        Raises DownstreamError at once when ``max_inflight`` requests are already waiting (what
        :meth:`busy` says beforehand). The pipeline starts it once the request has been read: a
        request that does not decode is never forwarded.
        """
        busy = self.busy()
        if busy is not None:
            raise busy
        self._inflight += 1
        sending = asyncio.ensure_future(self._send(self._exports[method], raw))
        # If the client goes away meanwhile nobody awaits the result: retrieve it anyway, so a
        # failure is not reported as an exception never retrieved.
        sending.add_done_callback(_retrieve)
        return sending

    async def _send(self, export: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes], raw: bytes) -> bytes:
        try:
            response: bytes = await export(raw, timeout=self._timeout)
            return response
        except grpc.aio.AioRpcError as exc:
            raise _downstream_error(exc, self.target, self._timeout) from None
        finally:
            self._inflight -= 1

    async def close(self) -> None:
        await self._channel.close(grace=None)


def _retrieve(sending: asyncio.Future[bytes]) -> None:
    if not sending.cancelled():
        sending.exception()


def _downstream_error(exc: grpc.aio.AioRpcError, target: str, timeout: float) -> DownstreamError:
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DownstreamError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the downstream {target} did not answer within {timeout:g} s",
            retryable=True,
            reason="timeout",
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return DownstreamError(
            grpc.StatusCode.UNAVAILABLE,
            f"the downstream {target} is unavailable: {exc.details()}",
            retryable=True,
            reason=code.name,
        )
    retryable = code == grpc.StatusCode.RESOURCE_EXHAUSTED
    return DownstreamError(code, f"the downstream {target} answered: {exc.details()}", retryable, code.name)
