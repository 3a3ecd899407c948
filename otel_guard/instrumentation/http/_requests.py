"""requests: ``Session.send``, which every request (``requests.get`` and a session's alike) goes through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests

from otel_guard.instrumentation._base import unless_suppressed
from otel_guard.instrumentation.http._outgoing import chain_member, with_member
from otel_guard.instrumentation.http._refusals import may_be_refusal, remote_refusal


@unless_suppressed
def guard_send(
    wrapped: Callable[..., requests.Response],
    instance: requests.Session,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> requests.Response:
    request: requests.PreparedRequest = args[0] if args else kwargs["request"]
    member = chain_member()
    if member is not None:
        current = request.headers.get("baggage")
        if isinstance(current, bytes):
            current = current.decode("latin-1")
        header = with_member(current, member)
        if header is not None:
            request.headers["baggage"] = header
    response = wrapped(*args, **kwargs)
    if response.status_code != 409:  # before any header look-up: nearly every response
        return response
    headers = response.headers
    length = headers.get("content-length")
    if (length is not None or not kwargs.get("stream")) and may_be_refusal(
        response.status_code, headers.get("content-type"), length
    ):
        refusal = remote_refusal(response.content, lambda: urlsplit(request.url or "").hostname or "")
        if refusal is not None:
            response.close()
            raise refusal
    return response
