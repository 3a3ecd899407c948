"""Binding the processor's listeners, and the one line that says why one cannot be bound.

Every listener fails the same way: ``cannot listen on 127.0.0.1:4390 for metrics (--prometheus):
address already in use``, an :class:`OSError` the CLI prints as it is. The HTTP servers are handed
a socket bound here; the gRPC receiver's server binds its own, in the engine, and raises the same
:class:`OSError` for :func:`cannot_listen` to word.
"""

from __future__ import annotations

import socket

from otel_guard_processor.config import parse_address

__all__ = ["bind", "cannot_listen"]


def cannot_listen(option: str, address: str, what: str, error: BaseException) -> OSError:
    """The error for a listener of ``what`` (``metrics``) on ``option``'s ``address``."""
    reason = (error.strerror if isinstance(error, OSError) and error.strerror else str(error)) or "failed"
    flag = "--" + option.replace("_", "-")
    return OSError(f"cannot listen on {address} for {what} ({flag}): {reason[:1].lower()}{reason[1:]}")


def bind(option: str, address: str, what: str) -> socket.socket:
    """A TCP socket bound to ``address``, listening, non-blocking."""
    host, port = parse_address(address, option=option)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise cannot_listen(option, address, what, exc) from None
    sock.setblocking(False)
    return sock
