"""The budget store of a fleet: the counts in one Redis, shared by every process (``budget_store``).

``pip install 'otel-guard[redis]'`` and ``OTEL_GUARD_BUDGET_STORE=redis://host:6379/0`` (``rediss://``
for TLS, ``unix:///path/redis.sock``). One take is one round trip: a Lua script that checks every
count a hop touches and adds one to each only if none would go past its limit, so two processes
racing for a tree's last hop never both get it. A count expires with its chain (``PEXPIREAT``), a
workspace count with its window.

Async code (``async with delegate(...)``, ``@agentic`` coroutines, the instrumentors' async paths)
goes through the client's asyncio API, one client per event loop, so the loop never blocks on the
round trip.

A hop never waits long for Redis: the client connects and reads with a short timeout
(:data:`TIMEOUT`), and after a failure the store is taken for down for :data:`DOWN_FOR` seconds, in
which every take fails at once instead of waiting again. A take that fails raises
:class:`~otel_guard.budget.StoreError`; ``budget_on_error`` decides what the hop gets.

The keys of one take are a tree's and its workspace's: a Redis Cluster would refuse a script over
two slots, so use one Redis (with replicas or Sentinel), not a cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, Final

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from otel_guard.budget import Meter, StoreError

TIMEOUT: Final = 0.25
"""Seconds to connect to Redis, and to wait for an answer."""

DOWN_FOR: Final = 1.0
"""Seconds the store is taken for down after a failure (every take fails at once meanwhile)."""

# KEYS: the counts. ARGV: for each, its limit (0: none), its expiry (unix milliseconds) and what the
# take adds (0: it only checks that the count is below its limit). Returns the counts after the take,
# or -i when the i-th count (1-based) is spent.
TAKE_SCRIPT: Final = """
local used = {}
for i, key in ipairs(KEYS) do
  local count = tonumber(redis.call('GET', key) or '0')
  local limit = tonumber(ARGV[3 * i - 2])
  local amount = tonumber(ARGV[3 * i])
  local need = amount
  if need == 0 then
    need = 1
  end
  if limit > 0 and count + need > limit then
    return -i
  end
  used[i] = count
end
for i, key in ipairs(KEYS) do
  local amount = tonumber(ARGV[3 * i])
  if amount > 0 then
    used[i] = redis.call('INCRBY', key, amount)
    if used[i] == amount then
      redis.call('PEXPIREAT', key, ARGV[3 * i - 1])
    end
  end
end
return used
"""


_TAKE_SHA: Final = hashlib.sha1(TAKE_SCRIPT.encode()).hexdigest()


class RedisStore:
    """The counts in Redis at ``url``, through one client (and its connection pool) per process."""

    def __init__(self, url: str, *, timeout: float = TIMEOUT, down_for: float = DOWN_FOR) -> None:
        self._url = url
        self._options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry_on_timeout": False,
            "health_check_interval": 0,
        }
        # No retries: a hop that cannot count asks budget_on_error instead of waiting again.
        self._client: Any = redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **self._options)
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._down_for = down_for
        self._down_until = 0.0
        self._lock = threading.Lock()

    # EVALSHA by hand, EVAL when Redis does not hold the script yet (which also loads it): redis-py's
    # Script object costs twice the round trip itself on every call (measured: 133 µs against 60).

    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        command = self._ask(meters)
        client = self._client
        try:
            try:
                result = client.evalsha(_TAKE_SHA, len(meters), *command)
            except redis.exceptions.NoScriptError:
                result = client.eval(TAKE_SCRIPT, len(meters), *command)
        except redis.RedisError as exc:
            raise self._failed(exc) from exc
        return _taken(result)

    async def atake(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        """:meth:`take` through the asyncio client of the running event loop."""
        command = self._ask(meters)
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        if client is None:
            client = self._async_clients[loop] = redis.asyncio.Redis.from_url(
                self._url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **self._options
            )
        try:
            try:
                result = await client.evalsha(_TAKE_SHA, len(meters), *command)
            except redis.exceptions.NoScriptError:
                result = await client.eval(TAKE_SCRIPT, len(meters), *command)
        except redis.RedisError as exc:
            raise self._failed(exc) from exc
        return _taken(result)

    def _ask(self, meters: Sequence[Meter]) -> list[str]:
        """The script's keys and arguments; raises at once while the store is taken for down."""
        if self._down_until > time.monotonic():
            raise StoreError("the Redis budget store failed a moment ago; not asking again yet")
        command = [meter.key for meter in meters]
        for meter in meters:
            command += (str(meter.limit), str(int(meter.expires_at * 1000)), str(meter.amount))
        return command

    def _failed(self, exc: Exception) -> StoreError:
        with self._lock:
            self._down_until = time.monotonic() + self._down_for
        return StoreError(f"the Redis budget store did not answer: {type(exc).__name__}")

    def used(self, key: str, now: float) -> int:
        """The count under ``key`` now (0 when none): for tests and ``inspect``."""
        value = self._client.get(key)
        return int(value) if value is not None else 0

    def close(self) -> None:
        self._client.close()


def _taken(result: Any) -> tuple[int, ...] | int:
    """The script's answer: the counts, or the index of the spent meter (the script says -i)."""
    if isinstance(result, int):
        return -result - 1
    return tuple(int(count) for count in result)
