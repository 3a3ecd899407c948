"""Binding the processor's listeners, and the one line that says why one cannot be bound.

Every listener fails the same way: ``cannot listen on 127.0.0.1:4390 for metrics (--prometheus):
address already in use``, an :class:`OSError` the CLI prints as it is. The HTTP servers are handed
a socket bound here. gRPC binds its own, and when it cannot it logs a line of its C core to stderr
before raising, so its address is first tried here, and one that is taken never reaches gRPC.
"""

from __future__ import annotations

import contextlib
import socket

from otel_guard_processor.config import parse_address

__all__ = ["bind", "cannot_listen", "check_bindable"]


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


def check_bindable(option: str, address: str, what: str) -> None:
    """Raise :func:`cannot_listen` unless one of the addresses ``address`` resolves to can be bound
    now (gRPC listens on every one it can, and fails only when it can bind none)."""
    host, port = parse_address(address, option=option)
    if port == 0:
        return
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise cannot_listen(option, address, what, exc) from None
    first: OSError | None = None
    for family, kind, protocol, _, where in resolved:
        with contextlib.closing(socket.socket(family, kind, protocol)) as probe:
            # As gRPC binds: an address whose old connections wait in TIME_WAIT is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(where)
            except OSError as exc:
                first = first or exc
                continue
            return
    if first is not None:
        raise cannot_listen(option, address, what, first)
