"""The forwarder's downstream calls made by the engine's own gRPC client instead of grpcio (a
prototype: ``GrpcChannel``, in an engine built with the cargo feature ``h2-forwarder``).

The engine keeps one HTTP/2 connection to the downstream on a thread of its own and answers
each call through a batch taken on the event loop when one byte on a socket pair wakes it, as
the gRPC receiver's calls arrive (:mod:`otel_guard_processor.grpc_receiver`): no call waits on
the loop, and the loop does no HTTP/2.

What a reader would not guess: the request is sent as the ``bytes`` object it is, never copied,
so a request in flight is held once (grpcio holds a copy of its own while it sends). A call
whose caller is cancelled runs on to its deadline in the engine; only its answer is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from otel_guard_processor import _engine

__all__ = ["CallError", "EngineClient", "available"]

_CODES = {status.value[0]: status for status in grpc.StatusCode}


def available() -> bool:
    """Whether this engine was built with its gRPC client (the ``h2-forwarder`` feature)."""
    return hasattr(_engine, "GrpcChannel")


class CallError(Exception):
    """The downstream (or the way to it) did not answer OK: its status, as grpcio's AioRpcError."""

    def __init__(self, code: grpc.StatusCode, details: str, status_details: bytes | None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.status_details = status_details  # grpc-status-details-bin, a google.rpc.Status


class EngineClient:
    """Unary calls to one downstream through the engine's ``GrpcChannel``."""

    def __init__(self, target: str, *, max_send_bytes: int, gzip: bool = False, stack: str = "h2") -> None:
        if not available():
            raise RuntimeError(
                "this engine was built without its gRPC client: build it with the cargo feature "
                "h2-forwarder, or forward with grpcio"
            )
        self.target = target
        self._channel = _engine.GrpcChannel(target, gzip=gzip, max_send_bytes=max_send_bytes, stack=stack)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(
        self, method: str, raw: bytes, *, timeout: float, metadata: Sequence[tuple[str, str]]
    ) -> bytes:
        """The downstream's response to ``raw`` sent to ``method``; raises :class:`CallError`."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            loop.add_reader(self._channel.wake_fd(), self._take)
        answer: asyncio.Future[bytes] = loop.create_future()
        call_id = self._channel.call(method, raw, list(metadata), timeout)
        self._pending[call_id] = answer
        try:
            return await answer
        finally:
            self._pending.pop(call_id, None)

    def _take(self) -> None:
        for call_id, code, message, details, response in self._channel.take():
            answer = self._pending.pop(call_id, None)
            if answer is None or answer.done():
                continue
            if code == 0:
                answer.set_result(response)
            else:
                answer.set_exception(CallError(_CODES.get(code, grpc.StatusCode.UNKNOWN), message, details))

    async def close(self) -> None:
        """End the calls in flight (answered CANCELLED here) and the connection."""
        if self._loop is not None:
            self._loop.remove_reader(self._channel.wake_fd())
            self._loop = None
        await asyncio.to_thread(self._channel.close)
        pending, self._pending = self._pending, {}
        for answer in pending.values():
            if not answer.done():
                answer.set_exception(CallError(grpc.StatusCode.CANCELLED, "the channel was closed", None))
