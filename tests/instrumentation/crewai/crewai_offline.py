"""A watch on the network: every attempt of this process (any thread) to reach another host."""

from __future__ import annotations

import socket
import sys
from typing import Any

_LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost", "", None}


def watch_network() -> list[str]:
    """Start recording lookups of and connections to hosts other than this one; the list fills as
    they happen (an audit hook sees the sockets of every thread, CrewAI's included)."""
    attempts: list[str] = []

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.getaddrinfo":
            host = args[0].decode() if isinstance(args[0], bytes) else args[0]
            if host not in _LOCAL_HOSTS:
                attempts.append(f"lookup {host}")
        elif event == "socket.connect":
            sock, address = args
            if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL_HOSTS:
                attempts.append(f"connect {address}")

    sys.addaudithook(audit)
    return attempts
