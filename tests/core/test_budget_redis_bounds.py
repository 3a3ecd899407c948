"""The Redis store under a burst and under a Redis that never finishes a reply (issue 41.5).

* A burst of takes larger than the connection pool waits for a connection (up to the store's
  timeout), and a take that cannot get one in time fails per ``budget_on_error``, counted as a store
  error: 300 hops at once against a workspace cap of 30 make exactly 30, never 230.
* A Redis that answers the script with an endless reply, one byte at a time (each read well within
  the socket timeout), holds no take past its deadline: the take gives up within a small multiple of
  the store's timeout and the hop gets ``budget_on_error``.

The dripping Redis is a small socket server on 127.0.0.1 written here: it answers the client's
handshake (``HELLO``, ``CLIENT SETINFO``, ``PING``) and drips its answer to ``EVALSHA``/``EVAL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis_server import RedisServer
from test_budget import store_errors, store_errors_since

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard.budget import WORKSPACE_HOPS, Meter, StoreError
from otel_guard.budget.redis_store import TIMEOUT, RedisStore

pytestmark = pytest.mark.integration

BURST = 300
CAP = 30


# -- a burst larger than the pool -------------------------------------------------------------------


def roomy(server: RedisServer) -> str:
    """The server's URL with a deadline of 2 s a take: on a busy machine 300 threads may take longer
    than the default 0.25 s to be scheduled, and this test is about the pool, not the deadline (with
    the pool of before, the takes past its size fail at once whatever the deadline)."""
    return f"{server.url}?socket_timeout=2"


def burst_of_hops(server: RedisServer, count: int) -> Counter[str]:
    """``count`` threads entering a hop of a fresh tree at once, while Redis takes 50 ms to answer
    (paused, then resumed: well within the store's timeout): what each got."""
    barrier = threading.Barrier(count + 1)
    got: list[str] = []
    lock = threading.Lock()

    def hop(index: int) -> None:
        barrier.wait(10)
        try:
            with delegate(f"worker{index}"):
                outcome = "allow"
        except DelegationRefused as err:
            outcome = err.reason
        with lock:
            got.append(outcome)

    threads = [threading.Thread(target=hop, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    server.pause()
    try:
        barrier.wait(10)
        time.sleep(0.05)  # every thread is in its take: each holds a connection, or waits for one
    finally:
        server.resume()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    return Counter(got)


def test_a_burst_of_threads_past_the_pool_waits_and_never_passes_the_cap(
    redis_server: RedisServer, metric_reader: Any
) -> None:
    """Before: the pool ran out of connections (``MaxConnectionsError``) and, with
    ``budget_on_error=allow``, 230 of 300 went through against a cap of 30."""
    otel_guard.configure(
        workspace_max_hops=CAP, max_hops=0, budget_store=roomy(redis_server), budget_on_error="allow"
    )
    before = store_errors(metric_reader)
    got = burst_of_hops(redis_server, BURST)
    assert got == {"allow": CAP, "budget": BURST - CAP}
    assert store_errors_since(before, metric_reader) == {}


async def test_a_burst_of_tasks_past_the_pool_waits_and_never_passes_the_cap(
    redis_server: RedisServer, metric_reader: Any
) -> None:
    otel_guard.configure(
        workspace_max_hops=CAP, max_hops=0, budget_store=roomy(redis_server), budget_on_error="allow"
    )
    before = store_errors(metric_reader)

    async def hop(index: int) -> str:
        try:
            async with delegate(f"worker{index}"):
                return "allow"
        except DelegationRefused as err:
            return err.reason

    got = Counter(await asyncio.wait_for(asyncio.gather(*(hop(i) for i in range(BURST))), 30))
    assert got == {"allow": CAP, "budget": BURST - CAP}
    assert store_errors_since(before, metric_reader) == {}


def workspace_meter(key: str) -> Meter:
    return Meter(key, CAP, time.time() + 60, WORKSPACE_HOPS)


def test_a_take_that_waits_past_the_timeout_for_a_connection_fails(redis_server: RedisServer) -> None:
    """The pool's one connection is held by a take on a paused Redis: the next take waits for a
    connection, at most about the store's timeout, then fails as a store error (before: it failed at
    once, ``MaxConnectionsError``)."""
    store = RedisStore(f"{redis_server.url}?max_connections=1", down_for=0.0)
    held_meter, meter = workspace_meter("workspace:ws:60:held"), workspace_meter("workspace:ws:60:wait")
    assert store.take([held_meter], time.time()) == (1,)
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            store.take([held_meter], time.time())
        except StoreError as exc:
            failed.append(exc)

    redis_server.pause()
    try:
        held = threading.Thread(target=hold)
        held.start()
        time.sleep(0.05)  # the first take holds the one connection
        started = time.monotonic()
        with pytest.raises(StoreError):
            store.take([meter], time.time())
        waited = time.monotonic() - started
        held.join(5)
    finally:
        redis_server.resume()
    assert len(failed) == 1
    assert 0.1 <= waited < 4 * TIMEOUT, waited
    assert store.take([meter], time.time()) == (1,)  # the take that waited sent nothing
    store.close()


# -- a Redis that drips an endless reply ------------------------------------------------------------


class DrippingRedis:
    """A fake Redis on 127.0.0.1: :data:`ANSWERS` (or ``+OK``) to the handshake, and to ``EVALSHA`` or
    ``EVAL`` an array of two billion integers, one byte every ``drip`` seconds, until the client hangs
    up."""

    def __init__(self, drip: float = 0.01) -> None:
        self._drip = drip
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._connections: list[socket.socket] = []
        self.scripts = 0  # EVALSHA/EVAL commands received
        self._accepting = threading.Thread(target=self._accept)

    def start(self) -> None:
        self._accepting.start()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._accepting.join(5)
        for thread in self._threads:
            thread.join(5)
        for connection in self._connections:
            connection.close()

    def _accept(self) -> None:
        self._listener.settimeout(0.05)
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._connections.append(connection)
            thread = threading.Thread(target=self._serve, args=(connection,))
            self._threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        reader = connection.makefile("rb")
        try:
            while not self._stop.is_set():
                command = read_command(reader)
                if command is None:
                    return
                name = command[0].upper()
                if name in (b"EVALSHA", b"EVAL"):
                    self.scripts += 1
                    self._drip_forever(connection)
                    return
                connection.sendall(ANSWERS.get(name, b"+OK\r\n"))
        except OSError:
            return
        finally:
            reader.close()

    def _drip_forever(self, connection: socket.socket) -> None:
        connection.sendall(b"*2000000000\r\n")
        while not self._stop.wait(self._drip):
            for byte in b":1\r\n":
                connection.sendall(bytes([byte]))
                if self._stop.wait(self._drip):
                    return


ANSWERS = {
    b"HELLO": b"%2\r\n+server\r\n+redis\r\n+proto\r\n:3\r\n",  # RESP3, as the client asks
    b"PING": b"+PONG\r\n",
}


def read_command(reader: Any) -> list[bytes] | None:
    """One RESP command (an array of bulk strings), or ``None`` when the client hung up."""
    line = reader.readline()
    if not line:
        return None
    assert line.startswith(b"*"), line
    parts = []
    for _ in range(int(line[1:])):
        size = int(reader.readline()[1:])
        parts.append(reader.read(size + 2)[:size])
    return parts


@pytest.fixture
def dripping_redis() -> Iterator[DrippingRedis]:
    server = DrippingRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def take_in_a_thread(
    store: RedisStore, meters: list[Meter], limit: float
) -> tuple[float, BaseException | None]:
    """Run ``store.take`` in a thread, waiting at most ``limit`` seconds: how long it took, what it
    raised (a take still running after ``limit`` fails the test; the server's stop ends it)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            store.take(meters, time.time())
            outcome.append(None)
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    thread.join(limit)
    took = time.monotonic() - started
    assert outcome, f"the take was still waiting after {took:.1f} s"
    return took, outcome[0]


def test_a_dripping_reply_holds_a_take_no_longer_than_its_deadline(dripping_redis: DrippingRedis) -> None:
    """Before: every read came within the socket timeout, and the take waited as long as the drip."""
    store = RedisStore(dripping_redis.url)
    took, error = take_in_a_thread(store, [workspace_meter("workspace:ws:60:drip")], 5.0)
    assert isinstance(error, StoreError), error
    assert "TimeoutError" in str(error)
    assert dripping_redis.scripts == 1
    assert took < 4 * TIMEOUT, took
    store.close()


async def test_an_async_take_on_a_dripping_reply_ends_at_its_deadline(dripping_redis: DrippingRedis) -> None:
    store = RedisStore(dripping_redis.url)
    started = time.monotonic()
    with pytest.raises(StoreError):
        await asyncio.wait_for(store.atake([workspace_meter("workspace:ws:60:drip")], time.time()), 5.0)
    assert time.monotonic() - started < 4 * TIMEOUT
    assert dripping_redis.scripts == 1
    store.close()


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
def test_a_hop_on_a_dripping_redis_gets_budget_on_error_in_time(
    dripping_redis: DrippingRedis, on_error: str, metric_reader: Any
) -> None:
    otel_guard.configure(max_hops=10, budget_store=dripping_redis.url, budget_on_error=on_error)
    before = store_errors(metric_reader)
    outcome: list[str | None] = []

    def hop() -> None:
        try:
            with delegate("planner") as planner:
                outcome.append(planner.decision)
        except DelegationRefused as err:
            outcome.append(err.reason)

    started = time.monotonic()
    thread = threading.Thread(target=hop)
    thread.start()
    thread.join(5.0)
    took = time.monotonic() - started
    assert outcome == (["allow"] if on_error == "allow" else ["budget"]), took
    assert took < 4 * TIMEOUT, took
    assert store_errors_since(before, metric_reader) == {"StoreError": 1}
