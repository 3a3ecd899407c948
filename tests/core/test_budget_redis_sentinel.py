"""Budgets through real Sentinel (issue 42.1): a master, its replica and a sentinel on 127.0.0.1.

Before, ``redis+sentinel://`` was refused; with the master's plain URL a real ``SENTINEL FAILOVER``
kept counting on the old master for about 11 s (lost), then every hop got ``ReadOnlyError`` until a
restart. Here a hop every 10 ms (sync and asyncio, each its own key) runs through the failover; the
hops not counted on the new master (lost on the old one, or failed) span at most 5 s, and counting
goes on afterwards with no restart.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from redis_fleet import SERVICE, running_sentinels, wait_until

from otel_guard.budget import HOPS, Meter, StoreError
from otel_guard.budget.redis_store import RedisStore

pytestmark = pytest.mark.integration

PACE = 0.01
BOUND = 5.0


def test_a_sentinel_failover_leaves_at_most_5_s_of_hops_uncounted(tmp_path: Path) -> None:
    with running_sentinels(tmp_path) as sentinels:
        assert sentinels.sentinel is not None
        store = RedisStore(sentinels.url)
        expires = time.time() + 300
        hops: list[tuple[str, float, bool]] = []  # key, when, whether the store said it counted
        stop = threading.Event()
        lock = threading.Lock()

        def take(key: str) -> None:
            try:
                counted = store.take([Meter(key, 0, expires, HOPS)], time.time()) == (1,)
            except StoreError:
                counted = False
            with lock:
                hops.append((key, time.monotonic(), counted))

        def in_thread() -> None:
            index = 0
            while not stop.is_set():
                take(f"tree:ws:sync{index}")
                index += 1
                time.sleep(PACE)

        async def in_loop() -> None:
            index = 0
            while not stop.is_set():
                key = f"tree:ws:async{index}"
                try:
                    counted = await store.atake([Meter(key, 0, expires, HOPS)], time.time()) == (1,)
                except StoreError:
                    counted = False
                with lock:
                    hops.append((key, time.monotonic(), counted))
                index += 1
                await asyncio.sleep(PACE)

        threads = [
            threading.Thread(target=in_thread),
            threading.Thread(target=lambda: asyncio.run(in_loop())),
        ]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)
            old = sentinels.master_port()
            failed_over_at = time.monotonic()
            sentinels.sentinel.ask("SENTINEL", "FAILOVER", SERVICE)
            wait_until("the sentinel names the new master", lambda: sentinels.master_port() != old)
            switched = time.monotonic() - failed_over_at
            new = sentinels.replica if sentinels.replica.port != old else sentinels.master
            # The old master turns replica when the sentinel tells it (up to 10 s: its INFO period);
            # the hops go on past that, and must be counted again well before it.
            wait_until(
                "the old master is a replica",
                lambda: (
                    (sentinels.master if old == sentinels.master.port else sentinels.replica)
                    .client()
                    .info("replication")["role"]
                    == "slave"
                ),
                20,
            )
            time.sleep(1.0)
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        client = new.client()
        uncounted = [at for key, at, _ in hops if not client.exists(key)]
        client.close()
        store.close()
        window = max(uncounted) - min(uncounted) + PACE if uncounted else 0.0
        print(
            f"sentinel switched after {switched:.2f} s; {len(uncounted)} of {len(hops)} hops uncounted "
            f"over {window:.2f} s"
        )
        assert window <= BOUND, window
        last = [counted for _, at, counted in hops if at > max(uncounted, default=0) + 1.0]
        assert last
        assert all(last)  # counted again, with no restart
