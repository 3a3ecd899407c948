"""A real Redis (Debian's ``redis-server``) on 127.0.0.1 for the budget store's tests, started and
stopped by the test that needs it. Its absence is a failure, never a skip: scripts/bootstrap installs it.

:func:`paused_under_probe` is how a test shows that a hop started in async code never blocks the
event loop: Redis stops answering (SIGSTOP) while a probe task measures how late the loop runs it.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis
from ports import free_port

START_TIMEOUT = 10.0


class RedisServer:
    """One ``redis-server`` in ``directory`` (with no persistence unless ``options`` say otherwise);
    ``stop()`` and ``start()`` again on the same port (a Redis outage, then its return)."""

    NO_PERSISTENCE = ("--save", "", "--appendonly", "no")

    def __init__(
        self,
        directory: Path,
        *options: str,
        port: int | None = None,
        config: Path | None = None,
        binary: str | None = None,
    ) -> None:
        if binary is None:
            binary = shutil.which("redis-server")
            if binary is None:
                raise AssertionError("redis-server is missing: scripts/bootstrap installs it (Debian's)")
        self._binary = binary
        self.directory = directory
        self.port = free_port() if port is None else port
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.probe_url = f"{self.url}?socket_timeout={PROBE_STORE_TIMEOUT}"
        """:attr:`url` with the store's timeout of the tests under a probe (:class:`LoopProbe`)."""
        self._config = [str(config)] if config is not None else []
        self._options = options or self.NO_PERSISTENCE
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(
            [self._binary, *self._config, "--bind", "127.0.0.1", "--port", str(self.port),
             "--dir", str(self.directory), *self._options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    if time.monotonic() > deadline or self._process.poll() is not None:
                        self.stop()
                        raise AssertionError(f"redis-server did not start on port {self.port}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)

    def pause(self) -> None:
        """Stop the server without closing its sockets (SIGSTOP): a Redis that does not answer."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0, socket_connect_timeout=1.0)


@contextmanager
def running_redis(directory: Path) -> Iterator[RedisServer]:
    """A started :class:`RedisServer` in ``directory``, stopped when the block ends (for tests
    outside tests/core, which have no ``redis_server`` fixture)."""
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()


PROBE_STORE_TIMEOUT = 1.0
"""The store's timeout in the tests that pause Redis under a probe (seconds): long beside the lag a
loaded machine gives a probe (0.14 s seen), so a hop that held the loop for it cannot pass as load."""

PROBE_TICK = 0.005
"""How often the probe asks the event loop to run it (seconds)."""


@dataclass
class LoopProbe:
    """What :func:`paused_under_probe` measured once its block is over."""

    lags: list[float] = field(default_factory=list)
    """How late the loop ran the probe each time, beyond :data:`PROBE_TICK` (seconds)."""
    waited: float = 0.0
    """How long the block ran (seconds)."""

    @property
    def max_lag(self) -> float:
        return max(self.lags, default=0.0)

    def assert_the_hop_waited_not_the_loop(self) -> None:
        """The block waited for the paused Redis (the store's :data:`PROBE_STORE_TIMEOUT`, through
        :attr:`RedisServer.probe_url`), and the event loop ran on meanwhile: a hop that held it would
        show one lag of about that timeout; a loaded machine's, a tenth of it at times."""
        assert self.waited >= 0.8 * PROBE_STORE_TIMEOUT, self.waited
        assert self.max_lag < PROBE_STORE_TIMEOUT / 2, self.lags


@asynccontextmanager
async def loop_probe() -> AsyncIterator[LoopProbe]:
    """Run the block with a probe task beside it, measuring how late the event loop runs it."""
    loop = asyncio.get_running_loop()
    probe = LoopProbe()
    stop = asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            before = loop.time()
            await asyncio.sleep(PROBE_TICK)
            probe.lags.append(loop.time() - before - PROBE_TICK)

    ticking = asyncio.ensure_future(tick())
    await asyncio.sleep(4 * PROBE_TICK)  # the probe is running before the block starts
    started = time.monotonic()
    try:
        yield probe
    finally:
        probe.waited = time.monotonic() - started
        stop.set()
        await ticking


@asynccontextmanager
async def paused_under_probe(server: RedisServer) -> AsyncIterator[LoopProbe]:
    """Run the block with ``server`` paused (it does not answer) under :func:`loop_probe`.

    A hop awaiting its store gives the loop to the probe; a hop that waits for Redis synchronously
    holds the loop for up to the store's timeout, and the probe's lag shows it. The server answers
    again, and the probe stops, before the block's error (if any) passes on.
    """
    async with loop_probe() as probe:
        server.pause()
        try:
            yield probe
        finally:
            server.resume()
