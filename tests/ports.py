"""Ports on 127.0.0.1 for the servers the tests start and that cannot report a port they chose.

What a reader would not guess: a port the kernel just called free is free only until someone binds it,
and a test often asks for several before it starts any server (a cluster's six nodes, each with its
bus port 10000 above). So a port is handed out once per test process, and never one that is 10000 away
from a port handed out before.
"""

from __future__ import annotations

import socket
import threading

_handed: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A port that was free a moment ago and that no earlier call of this process returned."""
    with _lock:
        for _ in range(200):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if not {port, port - 10000, port + 10000} & _handed:
                _handed.add(port)
                return port
    raise AssertionError("no free port on 127.0.0.1 that was not handed out already")
