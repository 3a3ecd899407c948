"""aiohttp: ``ClientSession._request``, which every request of a session goes through.

What a reader would not guess: aiohttp reads a body only when asked, so a response is read here only
when it may be a refusal and says its length; what was read stays for the app's own ``read()``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from multidict import CIMultiDict

from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.instrumentation.http._outgoing import chain_member, with_member
from otel_guard.instrumentation.http._refusals import may_be_refusal, remote_refusal


def _headers_with_chain(session: aiohttp.ClientSession, given: Any, member: str) -> Any:
    """The request's headers with the chain in its ``baggage`` (the session's default ``baggage``
    header counts as the request's when the request has none)."""
    headers: CIMultiDict[str] = CIMultiDict(given or {})
    current = headers.get("baggage")
    if current is None:
        current = session.headers.get("baggage")
    header = with_member(current, member)
    if header is None:
        return given
    headers["baggage"] = header
    return headers


@unless_suppressed
async def guard_request(
    wrapped: Callable[..., Awaitable[aiohttp.ClientResponse]],
    instance: aiohttp.ClientSession,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> aiohttp.ClientResponse:
    member = chain_member()
    if member is not None:
        kwargs["headers"] = _headers_with_chain(instance, kwargs.get("headers"), member)
    response = await wrapped(*args, **kwargs)
    if response.status != 409:  # before any header look-up: nearly every response
        return response
    length = response.headers.get("Content-Length")
    if length is not None and may_be_refusal(response.status, response.headers.get("Content-Type"), length):
        refusal = remote_refusal(await response.read(), lambda: response.url.host or "")
        if refusal is not None:
            response.release()
            raise refusal
    return response
