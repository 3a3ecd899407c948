"""The Redis store's clients for a fleet's Redis: a Redis Cluster (or Valkey cluster) and Sentinel.

Both are redis-py's own: ``RedisCluster`` (and its asyncio twin) follows MOVED, ASK and TRYAGAIN and
learns the new topology after a failover or a reshard; ``Sentinel.master_for`` finds the master.
This module only shapes them to the store's guarantees (a pool that waits, a deadline per take).

What a reader would not guess, twice over:

* **Slots.** A take is one script, and a cluster runs a script only over keys of one hash slot. The
  store's keys carry no hash tag of their own (one Redis keeps the keys it always had), so on a
  cluster each key gets one (:func:`cluster_key`): a tree's counts are tagged with the tree, so trees
  spread over the cluster's nodes, and a take of a tree's hops, model requests and tokens is one
  slot. The workspace's count is one key every hop touches: with ``workspace_max_hops`` on, a take is
  a tree's keys *and* the workspace's, and they can share a slot only if every tree is in the
  workspace's slot. Then the workspace's tag is on every count of the workspace (one node holds
  them: the node every hop goes to anyway, for the workspace's count), and a take stays all or none.
  So the processes of a fleet must agree on ``workspace_max_hops`` being on, as on every budget, and
  turning it on or off starts the living trees' counts afresh.
* **Sentinel.** ``master_for`` asks the sentinels for the master only when it opens a connection: its
  open connections go on writing to a demoted master (measured: about 10 s after ``SENTINEL
  FAILOVER``, until the old master turns replica; those counts are lost). The store asks the
  sentinels again every :data:`CHECK_MASTER_EVERY` seconds, at a take, and a new master closes every
  connection to the old one (:class:`MasterWatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import math
import time
from collections.abc import Sequence
from typing import Any, Final

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from otel_guard.budget.redis_urls import StoreUrl

CHECK_MASTER_EVERY: Final = 0.5
"""Seconds between two questions to the sentinels of which node is the master (at a take)."""

_TREE_SUFFIXES: Final = (":model_requests", ":tokens", ":cost", ":unpriced", ":received")


def _tag(text: str) -> str:
    """A hash tag of ``text``: itself in braces, or a digest of it when it holds a brace."""
    if not text or "{" in text or "}" in text:
        text = hashlib.sha1(text.encode()).hexdigest()[:16]
    return "{" + text + "}"


def cluster_key(key: str, by_workspace: bool) -> str:
    """``key`` as the store names it on a cluster: tagged with its tree's root, or with its workspace
    when ``by_workspace`` (``workspace_max_hops`` is on). A key of another shape is left as it is."""
    if key.startswith("tree:"):
        body, suffix = key[5:], ""
        for ending in _TREE_SUFFIXES:
            if body.endswith(ending):
                body, suffix = body[: -len(ending)], ending
                break
        workspace, colon, root = body.rpartition(":")
        if colon and root:
            if by_workspace:
                return f"tree:{_tag(workspace)}:{root}{suffix}"
            return f"tree:{workspace}:{_tag(root)}{suffix}"
    elif key.startswith("workspace:"):
        parts = key[10:].rsplit(":", 2)
        if len(parts) == 3:
            return f"workspace:{_tag(parts[0])}:{parts[1]}:{parts[2]}"
    return key


def cluster_keys(keys: Sequence[str], workspace_cap: bool) -> list[str]:
    """The keys of one take on a cluster (:func:`cluster_key`): by workspace when the take holds the
    workspace's count or ``workspace_cap`` is on, so that they share a slot."""
    by_workspace = workspace_cap or any(key.startswith("workspace:") for key in keys)
    return [cluster_key(key, by_workspace) for key in keys]


def _cluster_options(options: dict[str, Any]) -> dict[str, Any]:
    kept = dict(options)
    kept.pop("db", None)  # a cluster has database 0 only
    return kept


def cluster_client(url: StoreUrl, options: dict[str, Any], connection_class: type) -> Any:
    """redis-py's ``RedisCluster`` over ``url``'s nodes: each node's pool a ``BlockingConnectionPool``
    (``options``' ``max_connections`` and ``timeout``), its connections ``connection_class``. No
    retry after a connection error (the take fails, ``budget_on_error`` decides, and the next take
    finds the new topology); MOVED, ASK and TRYAGAIN are followed within the take."""
    return redis.cluster.RedisCluster(
        startup_nodes=[
            redis.cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
            for host, port in url.nodes
        ],
        connection_class=connection_class,
        connection_pool_class=redis.BlockingConnectionPool,
        retry=Retry(NoBackoff(), 0),
        require_full_coverage=False,
        ssl=url.tls,
        **_cluster_options(options),
    )


def node_of(nodes_manager: Any, key: str) -> str:
    """The node (``host:port``) a cluster client's ``nodes_manager`` sends ``key`` to now; "" when it
    knows none yet (the client has not asked the cluster for its slots)."""
    try:
        return str(nodes_manager.get_node_from_slot(key_slot(key.encode())).name)
    except (redis.RedisError, redis.exceptions.RedisClusterException, LookupError):
        return ""


class AsyncCluster:
    """redis-py's asyncio ``RedisCluster`` for one event loop, whose takes wait for a connection as
    the store's pools do: its nodes raise ``MaxConnectionsError`` when they have no connection free,
    so at most ``max_connections`` takes run at once (a take holds one connection at a time)."""

    def __init__(self, url: StoreUrl, options: dict[str, Any]) -> None:
        # Only what its constructor takes (no pool: no wait of a pool, nor its retry options).
        accepted = inspect.signature(redis.asyncio.cluster.RedisCluster.__init__).parameters
        kept = {name: value for name, value in _cluster_options(options).items() if name in accepted}
        size = int(kept.get("max_connections", 100))
        self.client = redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port) for host, port in url.nodes],
            retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
            require_full_coverage=False,
            ssl=url.tls,
            **kept,
        )
        self._slots = asyncio.Semaphore(size)

    @property
    def nodes_manager(self) -> Any:
        return self.client.nodes_manager

    async def evalsha(self, *args: Any) -> Any:
        async with self._slots:
            return await self.client.evalsha(*args)

    async def eval(self, *args: Any) -> Any:
        async with self._slots:
            return await self.client.eval(*args)


class _BlockingSentinelPool(redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's pool (connections to the master the sentinels name) that waits for a free
    connection as the store's other pools do."""


class _AsyncBlockingSentinelPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """:class:`_BlockingSentinelPool` for asyncio."""


def _sentinel_kwargs(url: StoreUrl, options: dict[str, Any]) -> dict[str, Any]:
    """The options of the connections to the sentinels: the store's timeouts, their own password."""
    kwargs: dict[str, Any] = {
        name: options[name] for name in ("socket_timeout", "socket_connect_timeout") if name in options
    }
    kwargs.update(url.sentinel_options)
    if url.tls:
        kwargs["ssl"] = True
    return kwargs


def sentinel_client(
    url: StoreUrl, options: dict[str, Any], connection_class: type
) -> tuple[Any, MasterWatch]:
    """The master ``url``'s sentinels name, through redis-py's ``Sentinel.master_for``, and the
    watch that asks them again (:class:`MasterWatch`)."""
    sentinel = redis.sentinel.Sentinel(list(url.nodes), sentinel_kwargs=_sentinel_kwargs(url, options))
    client = sentinel.master_for(
        url.service,
        connection_pool_class=_BlockingSentinelPool,
        connection_class=connection_class,
        retry=Retry(NoBackoff(), 0),
        **options,
    )
    return client, MasterWatch(client.connection_pool)


def async_sentinel_client(url: StoreUrl, options: dict[str, Any]) -> tuple[Any, MasterWatch]:
    """:func:`sentinel_client` for asyncio (one an event loop)."""
    sentinel = redis.asyncio.sentinel.Sentinel(
        list(url.nodes), sentinel_kwargs=_sentinel_kwargs(url, options)
    )
    client = sentinel.master_for(
        url.service,
        connection_pool_class=_AsyncBlockingSentinelPool,
        connection_class=redis.asyncio.sentinel.SentinelManagedSSLConnection
        if url.tls
        else redis.asyncio.sentinel.SentinelManagedConnection,
        retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
        **options,
    )
    return client, MasterWatch(client.connection_pool)


class MasterWatch:
    """Asks the sentinels which node is the master, at most once a :data:`CHECK_MASTER_EVERY`
    seconds, at a take; a new master makes the pool close its connections to the old one (the idle
    ones at once, the others as they come back: redis-py's ``SentinelConnectionPool`` does that when
    the address it learns changes). A sentinel that does not answer changes nothing: the take goes
    on to the master known."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._next = -math.inf

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + CHECK_MASTER_EVERY
        return True

    def check(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self._pool.get_master_address()

    async def acheck(self) -> None:
        with contextlib.suppress(redis.RedisError):
            await self._pool.get_master_address()
