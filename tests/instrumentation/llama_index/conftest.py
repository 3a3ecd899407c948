"""LlamaIndex tests: offline, and checked to stay offline.

LlamaIndex ships the tokenizer files its memory needs (no download), and its models here are
``MockFunctionCallingLLM``. Every test fails if anything in the process looks up or connects to a
host other than this one (an audit hook sees every thread's sockets).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

_LOCAL_HOSTS = {"127.0.0.1", "::1", "localhost", "", None}
_external: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.getaddrinfo":
        host = args[0].decode() if isinstance(args[0], bytes) else args[0]
        if host not in _LOCAL_HOSTS:
            _external.append(f"lookup {host}")
    elif event == "socket.connect":
        sock, address = args
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL_HOSTS:
            _external.append(f"connect {address}")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def offline() -> Iterator[None]:
    """Fails the test if it (or LlamaIndex under it) reached for another host."""
    _external.clear()
    yield
    assert _external == [], f"the test reached the network: {_external}"
