"""httpx: ``Client.send`` and ``AsyncClient.send``, which every request of either client goes through."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.instrumentation.http._outgoing import chain_member, with_member
from otel_guard.instrumentation.http._refusals import may_be_refusal, remote_refusal


def _add_chain(request: httpx.Request) -> None:
    member = chain_member()
    if member is not None:
        header = with_member(request.headers.get("baggage"), member)
        if header is not None:
            request.headers["baggage"] = header


def _refusal_read(response: httpx.Response, streamed: bool) -> bool:
    """Whether ``response`` may be a refusal whose body can be read here (a streamed response only
    when its length is known and small). The status first: httpx's header look-ups scan every header."""
    if response.status_code != 409:
        return False
    headers = response.headers
    length = headers.get("content-length")
    if streamed and length is None:
        return False
    return may_be_refusal(response.status_code, headers.get("content-type"), length)


@unless_suppressed
def guard_send(
    wrapped: Callable[..., httpx.Response],
    instance: httpx.Client,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> httpx.Response:
    request: httpx.Request = args[0] if args else kwargs["request"]
    _add_chain(request)
    response = wrapped(*args, **kwargs)
    if _refusal_read(response, bool(kwargs.get("stream"))):
        refusal = remote_refusal(response.read(), lambda: request.url.host)
        if refusal is not None:
            response.close()
            raise refusal
    return response


@unless_suppressed
async def aguard_send(
    wrapped: Callable[..., Awaitable[httpx.Response]],
    instance: httpx.AsyncClient,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> httpx.Response:
    request: httpx.Request = args[0] if args else kwargs["request"]
    _add_chain(request)
    response = await wrapped(*args, **kwargs)
    if _refusal_read(response, bool(kwargs.get("stream"))):
        refusal = remote_refusal(await response.aread(), lambda: request.url.host)
        if refusal is not None:
            await response.aclose()
            raise refusal
    return response
