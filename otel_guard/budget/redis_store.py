"""The budget store of a fleet: the counts in Redis, shared by every process (``budget_store``).

``pip install 'otel-guard[redis]'`` and ``OTEL_GUARD_BUDGET_STORE=redis://host:6379/0`` (``rediss://``
for TLS, ``unix:///path/redis.sock``), a Redis Cluster or Valkey cluster
(``redis+cluster://host:6379``) or Sentinel (``redis+sentinel://host:26379/service``): the URLs are
read by :mod:`otel_guard.budget.redis_urls`, the cluster's and Sentinel's clients (redis-py's own)
made by :mod:`otel_guard.budget.redis_fleet`. One take is one round trip: a Lua script that checks every
count a hop touches and adds one to each only if none would go past its limit, so two processes
racing for a tree's last hop never both get it. A count expires with its chain (``PEXPIREAT``), a
workspace count with its window.

A key that holds no count (overwritten by anyone who can write to the Redis: ``abc``, ``1.5``, a list)
is that key's error alone: the take raises :class:`~otel_guard.budget.BadCount` (its tree gets
``budget_on_error``), the store is not taken for down for the other trees, and the key is left as it
is -- evidence, not repaired -- but given the expiry its count would have had.

Async code (``async with delegate(...)``, ``@agentic`` coroutines, the instrumentors' async paths)
goes through the client's asyncio API, one client per event loop, so the loop never blocks on the
round trip.

A hop never waits long for Redis: a take has a deadline (:data:`TIMEOUT` after it starts) for all
its reads and writes together -- a reply that drips a byte at a time, each read within a socket's
timeout, is cut there all the same -- and after a failure the store is taken for down for
:data:`DOWN_FOR` seconds, in which every take fails at once instead of waiting again. The client's
connections are a pool of :data:`MAX_CONNECTIONS` (each event loop's too): a burst of more takes at
once waits for a connection, up to the store's timeout, and a take that gets none in time fails as
any other; a burst never finds the pool empty and goes uncounted. A take that fails raises
:class:`~otel_guard.budget.StoreError`; ``budget_on_error`` decides what the hop gets. An outage is
never silent (with ``budget_on_error=allow`` it turns budgets off): the store logs one warning when
it cannot be reached where the guard starts (:meth:`RedisStore.probe`) or at its first take, one when
it stops answering after it did (at most one each :data:`WARN_EVERY` seconds), and an info line when
it answers again -- naming the URL without its password.

On a cluster, the keys of one take share a hash slot (a tag of the tree's root, or of the workspace
when ``workspace_max_hops`` is on: :func:`~otel_guard.budget.redis_fleet.cluster_key`), and redis-py
follows MOVED, ASK and TRYAGAIN within the take's deadline; a take that meets a failing node fails
(``budget_on_error``) and the next one finds the new topology. On a cluster a failing node is taken
for down alone: the trees whose slots other nodes serve go on counting, and the warning names the
node. Through Sentinel, the store asks the
sentinels which node is the master every half second, so after a failover at most about that (and
the sentinels' own switch) of hops go to the old master and are lost; a ``ReadOnlyError`` from a
demoted master fails its take and the next take finds the new master.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final

import redis
import redis.asyncio
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from otel_guard.budget import redis_fleet
from otel_guard.budget._store import MAX_COUNT, BadCount, Meter, SlotMigrating, StoreError
from otel_guard.budget.redis_urls import read_store_url
from otel_guard.settings import current_settings, redacted_url

TIMEOUT: Final = 0.25
"""Seconds to connect to Redis, to wait for a connection of the pool, and the deadline of a take's
round trip (all its reads and writes together). A URL's ``socket_timeout`` option sets another."""

MAX_CONNECTIONS: Final = 100
"""Connections in the store's pool (redis-py's own default ceiling), each event loop's pool too: a
take holds one for its round trip, so this many takes at once never wait. A URL's
``max_connections`` option sets another size."""

DOWN_FOR: Final = 1.0
"""Seconds the store is taken for down after a failure (every take fails at once meanwhile)."""

WARN_EVERY: Final = 60.0
"""Seconds at least between two warnings that the store stopped answering (a Redis that comes and goes)."""

_log = logging.getLogger("otel_guard")


@dataclass
class _Outage:
    """What the store knows of one place it sends takes to: the whole store, or one node of a cluster."""

    down_until: float = -math.inf
    answering: bool | None = None  # None: not asked yet
    warned_at: float = -math.inf
    quiet: bool = False  # this outage was not told (rate limit): nor will its end be


# KEYS: the counts. ARGV: for each, its limit (0: none), its expiry (unix milliseconds) and what the
# take adds (0: it only checks that the count is below its limit), each at most MAX_COUNT. Returns the
# counts after the take; -i when the i-th count (1-based) is spent; {error type, i} when the i-th key
# holds no count. Every key is read and checked before any is written, so a take that does not count
# leaves every count as it was (a script runs alone: nothing comes between the check and the write).
# A key that holds no count (another type, or a string that is not a whole number from 0 to
# MAX_COUNT, as INCRBY writes them) is left as it is but gets the expiry its count would have had.
TAKE_SCRIPT: Final = """
local most = 'MAX_COUNT'
local counts = {}
local bad = nil
for i, key in ipairs(KEYS) do
  local value = redis.pcall('GET', key)
  local kind = nil
  if type(value) == 'table' then
    kind = 'bad_type'
  elseif not value then
    counts[i] = 0
  elseif (value == '0' or string.find(value, '^[1-9]%d*$'))
      and (#value < #most or (#value == #most and value <= most)) then
    counts[i] = tonumber(value)
  else
    kind = 'bad_value'
  end
  if kind then
    redis.call('PEXPIREAT', key, ARGV[3 * i - 1])
    bad = bad or {kind, i}
  end
end
if bad then
  return bad
end
for i = 1, #KEYS do
  local limit = tonumber(ARGV[3 * i - 2])
  local need = tonumber(ARGV[3 * i])
  if need == 0 then
    need = 1
  end
  if limit > 0 and counts[i] + need > limit then
    return -i
  end
end
local used = {}
for i, key in ipairs(KEYS) do
  local amount = tonumber(ARGV[3 * i])
  used[i] = counts[i]
  if amount > 0 then
    if counts[i] + amount > tonumber(most) then
      redis.call('SET', key, most)
      used[i] = tonumber(most)
    else
      used[i] = redis.call('INCRBY', key, amount)
    end
    if counts[i] == 0 or redis.call('PTTL', key) < 0 then
      redis.call('PEXPIREAT', key, ARGV[3 * i - 1])
    end
  end
end
return used
""".replace("MAX_COUNT", str(MAX_COUNT))


_TAKE_SHA: Final = hashlib.sha1(TAKE_SCRIPT.encode()).hexdigest()


class RedisStore:
    """The counts in Redis at ``url``, through one client (and its connection pool) per process.

    It says when it cannot be reached, on the ``otel_guard`` logger: one warning the first time (at
    :meth:`probe`, where the guard starts, or at the first take), one when it stops answering after it
    did, at most one a ``warn_every`` seconds, and an info line when it answers again after a warning.
    ``clock`` (monotonic seconds) is for tests.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float | None = None,
        down_for: float | None = None,
        warn_every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self.name = redacted_url(url)
        self._read = read = read_store_url(url)
        parsed = read.options
        given = parsed.get("socket_timeout")
        timeout = float(given) if given is not None else TIMEOUT if timeout is None else timeout
        self.timeout = timeout
        """The deadline of a take, in seconds (the URL's ``socket_timeout`` when it sets one)."""
        # The URL's options win over these, as redis-py's from_url has it.
        self._options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry_on_timeout": False,
            "health_check_interval": 0,
            "max_connections": MAX_CONNECTIONS,
            "timeout": timeout,  # the wait for a connection of a pool whose every one is in use
        }
        self._cluster = read.kind == "cluster"
        self._watch: redis_fleet.MasterWatch | None = None  # Sentinel: which node is the master
        if read.kind == "single":
            connection = _on_deadline(parsed.get("connection_class", redis.connection.Connection))
            # No retries: a hop that cannot count asks budget_on_error instead of waiting again.
            pool = redis.BlockingConnectionPool.from_url(
                url, connection_class=connection, retry=Retry(NoBackoff(), 0), **self._options
            )
            self._client: Any = redis.Redis(connection_pool=pool)
        else:
            options = {**self._options, **{k: v for k, v in read.options.items() if k != "socket_timeout"}}
            self._fleet_options = options
            if read.kind == "cluster":
                self._client = None  # made at the first take: RedisCluster asks its nodes when made
            else:
                connection = _SentinelTLSConnection if read.tls else _SentinelConnection
                self._client, self._watch = redis_fleet.sentinel_client(read, options, connection)
        self._async_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._down_for = DOWN_FOR if down_for is None else down_for
        self._warn_every = WARN_EVERY if warn_every is None else warn_every
        self._clock = clock
        self._lock = threading.Lock()
        self._making = threading.Lock()
        # "" is the whole store (and a cluster's client being made); a cluster's nodes by name.
        self._outages: dict[str, _Outage] = {"": _Outage()}
        self._password = str(parsed.get("password") or "")

    # EVALSHA by hand, EVAL when Redis does not hold the script yet (which also loads it): redis-py's
    # Script object costs twice the round trip itself on every call (measured: 133 µs against 60).

    def take(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        command = self._ask(meters)
        self._refuse_while_down("")
        deadline = _DEADLINE.set(time.monotonic() + self.timeout)
        where = ""
        try:
            try:
                client = self._client if self._client is not None else self._cluster_client()
            except Exception as exc:  # a RedisError, or a client the URL's options broke (TypeError)
                raise self._failed(exc, where) from exc
            if self._cluster:
                where = redis_fleet.node_of(client.nodes_manager, command[0])
                self._refuse_while_down(where)
            try:
                watch = self._watch
                if watch is not None and watch.due():
                    watch.check()
                try:
                    result = client.evalsha(_TAKE_SHA, len(meters), *command)
                except redis.exceptions.NoScriptError:
                    result = client.eval(TAKE_SCRIPT, len(meters), *command)
            except Exception as exc:
                raise self._failed(exc, where) from exc
        finally:
            _DEADLINE.reset(deadline)
        self._succeeded(where)
        return _taken(result, meters)

    async def atake(self, meters: Sequence[Meter], now: float) -> tuple[int, ...] | int:
        """:meth:`take` through the asyncio client of the running event loop."""
        command = self._ask(meters)
        self._refuse_while_down("")
        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop)
        where = ""
        try:
            if client is None:
                client = self._async_clients[loop] = self._async_client(loop)
            if self._cluster:
                where = redis_fleet.node_of(client.nodes_manager, command[0])
        except Exception as exc:
            raise self._failed(exc, where) from exc
        self._refuse_while_down(where)
        try:
            watch = self._async_watches.get(loop)
            async with asyncio.timeout(self.timeout):  # the take's deadline, the pool's wait included
                if watch is not None and watch.due():
                    await watch.acheck()
                try:
                    result = await client.evalsha(_TAKE_SHA, len(meters), *command)
                except redis.exceptions.NoScriptError:
                    result = await client.eval(TAKE_SCRIPT, len(meters), *command)
        except Exception as exc:
            raise self._failed(exc, where) from exc
        self._succeeded(where)
        return _taken(result, meters)

    def _cluster_client(self) -> Any:
        """The cluster's client, made now (it asks the nodes for the topology, under the deadline)."""
        with self._making:
            if self._client is None:
                connection = _TLSConnection if self._read.tls else _TCPConnection
                self._client = redis_fleet.cluster_client(self._read, self._fleet_options, connection)
            return self._client

    def _async_client(self, loop: asyncio.AbstractEventLoop) -> Any:
        """The asyncio client of ``loop`` (its own pool, or a cluster's nodes, or Sentinel's)."""
        read = self._read
        if read.kind == "cluster":
            return redis_fleet.AsyncCluster(read, self._fleet_options)
        if read.kind == "sentinel":
            client, self._async_watches[loop] = redis_fleet.async_sentinel_client(read, self._fleet_options)
            return client
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            self._url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **self._options
        )
        return redis.asyncio.Redis(connection_pool=pool)

    def probe(self) -> None:
        """Ask Redis once (``PING``, within the store's timeout) if nothing has asked it yet: where the
        guard starts, so a store that cannot be reached says so then, before any hop."""
        if self._outages[""].answering is not None:
            return
        deadline = _DEADLINE.set(time.monotonic() + self.timeout)
        try:
            client = self._client if self._client is not None else self._cluster_client()
            client.ping()
        except Exception as exc:
            self._failed(exc, "")
            return
        finally:
            _DEADLINE.reset(deadline)
        self._answered("")

    def _refuse_while_down(self, where: str) -> None:
        """Raises at once while ``where`` (the store, or a cluster's node) is taken for down."""
        outage = self._outages.get(where)
        if outage is not None and outage.down_until > self._clock():
            place = f"node {where} of " if where else ""
            raise StoreError(f"the {place}Redis budget store failed a moment ago; not asking again yet")

    def _ask(self, meters: Sequence[Meter]) -> list[str]:
        """The script's keys and arguments."""
        command = [meter.key for meter in meters]
        if self._cluster:
            command = redis_fleet.cluster_keys(command, current_settings().workspace_max_hops > 0)
        for meter in meters:
            limit, amount = min(meter.limit, MAX_COUNT), min(meter.amount, MAX_COUNT)
            command += (str(limit), str(int(meter.expires_at * 1000)), str(amount))
        return command

    def _failed(self, exc: Exception, where: str) -> StoreError:
        """What a take that failed at ``where`` (the store, or a cluster's node) raises; that place
        taken for down for a moment, and said so."""
        if isinstance(exc, redis.exceptions.TryAgainError | redis.exceptions.ClusterError):
            # A slot on the move (TRYAGAIN, or redirections past redis-py's TTL): this take only.
            return SlotMigrating(f"the budget store's slot is moving between nodes: {type(exc).__name__}")
        with self._lock:
            now = self._clock()
            outage = self._outages.setdefault(where, _Outage())
            outage.down_until = now + self._down_for
            was, outage.answering = outage.answering, False
            if was is None and not where:
                self._warn(exc, "cannot be reached", now, outage, where)
            elif was is not False and now - outage.warned_at >= self._warn_every:
                self._warn(exc, "stopped answering", now, outage, where)
            elif was:
                outage.quiet = True
        return StoreError(f"the Redis budget store did not answer: {type(exc).__name__}")

    def _succeeded(self, where: str) -> None:
        """A take at ``where`` was answered: that place, and the store, answer (said if they did not)."""
        outage = self._outages.get(where)
        if outage is None or outage.answering is not True:
            self._answered(where)
        if where and self._outages[""].answering is not True:
            self._answered("")

    def _answered(self, where: str) -> None:
        with self._lock:
            outage = self._outages.setdefault(where, _Outage())
            was, outage.answering = outage.answering, True
            if was is False and not outage.quiet:
                _log.info(
                    "otel-guard: the budget store %s answers again; hops are counted", self._place(where)
                )
            outage.quiet = False

    def _place(self, where: str) -> str:
        return f"{self.name} (its node {where})" if where else self.name

    def _warn(self, exc: Exception, what: str, now: float, outage: _Outage, where: str) -> None:
        outage.warned_at = now
        outage.quiet = False
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self._password:  # redis-py's errors do not repeat it; this makes sure no line of ours does
            reason = reason.replace(self._password, "***")
        on_error = current_settings().budget_on_error
        then = "allowed uncounted" if on_error == "allow" else "refused (reason budget)"
        _log.warning(
            "otel-guard: the budget store %s %s (%s); budget_on_error is %s: hops will be %s until it "
            "answers",
            self._place(where),
            what,
            reason,
            on_error,
            then,
        )

    def used(self, key: str, now: float) -> int:
        """The count under ``key`` now (0 when none): for tests and ``inspect``."""
        if self._cluster:
            key = redis_fleet.cluster_keys([key], current_settings().workspace_max_hops > 0)[0]
        client = self._client if self._client is not None else self._cluster_client()
        value = client.get(key)
        return int(value) if value is not None else 0

    def close(self) -> None:
        client = self._client
        if client is None:
            return
        client.close()
        if not self._cluster:
            client.connection_pool.disconnect()


_DEADLINE: ContextVar[float] = ContextVar("otel_guard_redis_deadline", default=math.inf)
"""When the take running in this thread must be over (monotonic seconds): read by its sockets."""


class _DeadlineSocket:
    """A connection's socket whose every read and write gives up at the take's deadline
    (:data:`_DEADLINE`), besides the socket's own timeout of silence: a reply that drips a byte at a
    time never lets that timeout pass, and is cut at the deadline all the same (``socket.timeout``,
    which the client answers by dropping the connection, reply unread). Anything else is the socket's.
    """

    __slots__ = ("_sock", "_timeout")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._timeout: float | None = sock.gettimeout()

    def settimeout(self, value: float | None) -> None:
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _arm(self) -> None:
        left = _DEADLINE.get() - time.monotonic()
        timeout = self._timeout
        if left == math.inf:
            self._sock.settimeout(timeout)
        elif left <= 0:
            raise TimeoutError("the budget store's take ran out of time")
        else:
            self._sock.settimeout(left if timeout is None or left < timeout else timeout)

    def recv(self, size: int, *flags: int) -> bytes:
        self._arm()
        data: bytes = self._sock.recv(size, *flags)
        return data

    def recv_into(self, buffer: Any, *args: int) -> int:
        self._arm()
        size: int = self._sock.recv_into(buffer, *args)
        return size

    def sendall(self, data: Any, *flags: int) -> None:
        self._arm()
        self._sock.sendall(data, *flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _OnDeadline:
    """A connection whose socket is under the take's deadline (:class:`_DeadlineSocket`)."""

    def _connect(self) -> Any:
        return _DeadlineSocket(super()._connect())  # type: ignore[misc]


class _TCPConnection(_OnDeadline, redis.connection.Connection):
    pass


class _TLSConnection(_OnDeadline, redis.connection.SSLConnection):
    pass


class _UnixConnection(_OnDeadline, redis.connection.UnixDomainSocketConnection):
    pass


class _SentinelConnection(_OnDeadline, redis.sentinel.SentinelManagedConnection):
    pass


class _SentinelTLSConnection(_OnDeadline, redis.sentinel.SentinelManagedSSLConnection):
    pass


_ON_DEADLINE: Final[dict[type, type]] = {
    redis.connection.Connection: _TCPConnection,
    redis.connection.SSLConnection: _TLSConnection,
    redis.connection.UnixDomainSocketConnection: _UnixConnection,
}


def _on_deadline(connection: type) -> type:
    """redis-py's connection class for a URL's scheme (TCP, TLS, Unix socket), under the deadline."""
    return _ON_DEADLINE[connection]


def _taken(result: Any, meters: Sequence[Meter]) -> tuple[int, ...] | int:
    """The script's answer: the counts, or the index of the spent meter (the script says -i); raises
    :class:`~otel_guard.budget.BadCount` when a key holds no count (the script says which)."""
    if isinstance(result, int):
        return -result - 1
    if result and isinstance(result[0], bytes | str):
        kind = result[0].decode() if isinstance(result[0], bytes) else result[0]
        raise BadCount(meters[int(result[1]) - 1].key, kind)
    return tuple(int(count) for count in result)
