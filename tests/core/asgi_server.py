"""An ASGI app served by uvicorn in a thread of this process, on 127.0.0.1, for tests that call it live.

``serving(app)`` starts the server on a free port, yields its base URL and stops it (and checks that
it stopped) when the block ends.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

START_SECONDS = 10.0
STOP_SECONDS = 15.0


@contextmanager
def serving(app: Any, **config: Any) -> Iterator[str]:
    """Serve ``app`` (``config``: more ``uvicorn.Config`` options) until the block ends."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, **{"log_level": "critical", "lifespan": "auto", **config}))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_SECONDS
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=STOP_SECONDS)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
