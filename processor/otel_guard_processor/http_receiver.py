"""The OTLP/HTTP receiver (``POST /v1/traces``, ``/v1/metrics``, ``/v1/logs``) and the small ASGI
server it and ``/metrics`` run on.

Requests are ``application/x-protobuf`` (forwarded as the bytes received) or ``application/json``
(OTLP/JSON: hex ids, converted to protobuf and forwarded so), optionally ``Content-Encoding:
gzip``. The body is read with a limit: more than ``max_request_bytes`` -- as sent or once
decompressed -- is answered 413 without reading (or inflating) the rest. Every byte of it, from
the first chunk, is held in the processor's one memory budget (``max_pending_bytes``; its HTTP
share, :mod:`otel_guard_processor.budget_shares`), and so are
what it inflates to and the JSON conversion's share (:data:`~otel_guard_processor.conversion.JSON_HELD`
times the body while it converts); past it the request is answered 429 with ``Retry-After`` at
once, the rest of the body unread. Inflation and the JSON conversion run off the event loop
(:mod:`otel_guard_processor.conversion`). Answers follow the OTLP/HTTP
specification: the response (or a ``google.rpc.Status`` on error) in the request's content type,
400 for a malformed request, 415 for another content type or encoding, 429 / 503 with
``Retry-After`` when the client should retry.

Both HTTP endpoints are Starlette apps served by uvicorn inside the processor's event loop; the
processor owns the signals (uvicorn's own handlers are not installed) and binds the sockets itself,
so a port already in use is an error it reports, not an exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator

import grpc
import uvicorn
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from otel_guard_processor._engine import MemoryBudget, Reservation
from otel_guard_processor.conversion import Busy, Conversion, TooLarge, Unavailable
from otel_guard_processor.headers import BadHeader, pick
from otel_guard_processor.listeners import bind
from otel_guard_processor.otlp import MalformedRequest
from otel_guard_processor.pipeline import Answer, Pipeline, http_status
from otel_guard_processor.signals import UNREAD, Unread

__all__ = ["AsgiServer", "build_http_app"]

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def build_http_app(
    pipeline: Pipeline, max_request_bytes: int, read_timeout: float = 30.0, budget: MemoryBudget | None = None
) -> Starlette:
    """The Starlette app of the OTLP/HTTP receiver: ``/v1/traces``, ``/v1/metrics``, ``/v1/logs``.
    A body that takes longer than ``read_timeout`` seconds to arrive is answered 408 and its
    connection closed. Its requests' bytes are drawn from ``budget`` (the HTTP share of the
    memory budget; by default the pipeline's whole one). Its workers (``app.state.conversion``)
    end with the :class:`AsgiServer` that serves it."""
    conversion = Conversion()
    drawn = pipeline.budget if budget is None else budget
    routes = [
        Route(
            "/v1/traces",
            _endpoint(pipeline, drawn, conversion, None, max_request_bytes, read_timeout),
            methods=["POST"],
        )
    ]
    routes += [
        Route(
            signal.http_path,
            _endpoint(pipeline, drawn, conversion, signal, max_request_bytes, read_timeout),
            methods=["POST"],
        )
        for signal in UNREAD
    ]
    app = Starlette(routes=routes)
    app.state.conversion = conversion
    return app


def _endpoint(
    pipeline: Pipeline,
    budget: MemoryBudget,
    conversion: Conversion,
    signal: Unread | None,
    max_request_bytes: int,
    read_timeout: float,
) -> Callable[[Request], Awaitable[Response]]:
    """The handler of one signal's path: traces (``signal`` None), metrics or logs."""
    signal_name = "traces" if signal is None else signal.name
    response_type = ExportTraceServiceResponse if signal is None else signal.response

    async def export(request: Request) -> Response:
        started = time.perf_counter()
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        is_json = content_type == JSON

        def reply(answer: Answer, status: int | None = None) -> Response:
            return _reply(answer, is_json, response_type, status)

        if content_type not in (PROTOBUF, JSON):
            answer = pipeline.refuse("http", "unsupported", grpc.StatusCode.INVALID_ARGUMENT,
                                     f"unsupported Content-Type {content_type!r}; use {PROTOBUF} or {JSON}",
                                     0, started)  # fmt: skip
            return reply(answer, status=415)
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            answer = pipeline.refuse("http", "unsupported", grpc.StatusCode.INVALID_ARGUMENT,
                                     f"unsupported Content-Encoding {encoding!r}; use gzip or none",
                                     0, started)  # fmt: skip
            return reply(answer, status=415)
        # Every byte of the request, from its first chunk until the pipeline has it, held here;
        # its declared length is its claim to room kept for it when it is refused and comes again.
        with budget.empty() as held:
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and len(declared) <= 19:
                held.declare(int(declared))
            try:
                async with asyncio.timeout(read_timeout):
                    body = await _read_body(request, max_request_bytes, held)
            except TimeoutError:
                answer = pipeline.refuse("http", "timeout", grpc.StatusCode.DEADLINE_EXCEEDED,
                                         f"request body not received within read_timeout "
                                         f"({read_timeout:g} s)", 0, started)  # fmt: skip
                response = reply(answer, status=408)
                response.headers["connection"] = "close"
                return response
            except TooLarge:
                return reply(_too_large(pipeline, max_request_bytes, started), status=413)
            except Busy:
                return reply(pipeline.busy("http", held.bytes, started))
            size = len(body)
            try:
                if encoding == "gzip":
                    body = await conversion.inflate(body, max_request_bytes, held)
                    held.shrink(size)  # the body as sent is let go of
                if is_json:
                    body = await conversion.to_protobuf(signal_name, body, held)
                if not held.resize(len(body)):
                    raise Busy
            except TooLarge:
                return reply(_too_large(pipeline, max_request_bytes, started), status=413)
            except Busy:
                return reply(pipeline.busy("http", size, started))
            except Unavailable:
                answer = pipeline.refuse("http", "busy", grpc.StatusCode.UNAVAILABLE,
                                         "the OTLP/JSON conversion's worker stopped; retry later",
                                         size, started, retryable=True)  # fmt: skip
                return reply(answer)
            except zlib.error as exc:
                answer = pipeline.refuse("http", "invalid", grpc.StatusCode.INVALID_ARGUMENT,
                                         f"body is not valid gzip: {exc}", size, started)  # fmt: skip
                return reply(answer)
            except MalformedRequest as exc:
                answer = pipeline.refuse("http", "invalid", grpc.StatusCode.INVALID_ARGUMENT,
                                         str(exc), size, started)  # fmt: skip
                return reply(answer)
            try:
                headers = pick(pipeline.forward_headers, request.headers.getlist)
            except BadHeader as exc:
                answer = pipeline.refuse("http", "invalid", grpc.StatusCode.INVALID_ARGUMENT, str(exc),
                                         len(body), started)  # fmt: skip
                return reply(answer)
            if signal is None:
                return reply(await pipeline.export(body, "http", started, headers, held))
            return reply(await pipeline.export_unread(signal, body, "http", started, headers, held))

    return export


def _too_large(pipeline: Pipeline, max_request_bytes: int, started: float) -> Answer:
    return pipeline.refuse("http", "too_large", grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"request body is larger than max_request_bytes ({max_request_bytes})",
                           max_request_bytes, started)  # fmt: skip


async def _read_body(request: Request, limit: int, held: Reservation) -> bytes:
    """The body as sent, each chunk held in the budget before it is kept; :class:`TooLarge` as
    soon as it passes ``limit`` bytes, :class:`Busy` when the budget cannot hold the next chunk.
    The join of the chunks is not held: it is one body's copy for a moment on the event loop, at
    most one at a time (``max_request_bytes``, in the worst case's sum once)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        if not held.grow(len(chunk)):
            raise Busy
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _reply(
    answer: Answer, is_json: bool, response_type: type[Message], status: int | None = None
) -> Response:
    media_type = JSON if is_json else PROTOBUF
    headers: dict[str, str] = {}
    if answer.code == grpc.StatusCode.OK:
        body = answer.response
        if is_json:
            try:
                response = response_type.FromString(body)
            except DecodeError:
                response = response_type()  # the downstream acknowledged; say so
            body = json_format.MessageToJson(response).encode()
        return Response(body, status_code=200, media_type=media_type)
    if answer.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(answer.retry_after)))
    message = status_pb2.Status(code=answer.code.value[0], message=answer.message)
    payload = json_format.MessageToJson(message).encode() if is_json else message.SerializeToString()
    if status is None:
        # RESOURCE_EXHAUSTED with no retry delay is a request too large to take as it is (a span
        # larger than the downstream takes): 413, which OTLP/HTTP clients drop, not 429.
        too_large = answer.code == grpc.StatusCode.RESOURCE_EXHAUSTED and answer.retry_after is None
        status = 413 if too_large else http_status(answer.code)
    return Response(payload, status_code=status, media_type=media_type, headers=headers)


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the processor decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class AsgiServer:
    """One ASGI app served by uvicorn on a socket the processor bound itself (``option`` names the
    setting of its address, ``what`` what it serves, for the error when it cannot listen)."""

    def __init__(
        self, app: ASGIApp, address: str, *, option: str, what: str, graceful_timeout: float
    ) -> None:
        self._app = app
        self._socket = bind(option, address, what)
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=max(1, math.ceil(graceful_timeout)),
        )
        self._server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise OSError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to the graceful timeout)."""
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._socket.close()
        conversion = getattr(getattr(self._app, "state", None), "conversion", None)
        if isinstance(conversion, Conversion):
            conversion.stop()
