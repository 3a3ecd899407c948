"""The budget store of a fleet: a real Redis on 127.0.0.1, shared by threads and by processes.

Each test starts its own ``redis-server`` (no persistence) and stops it; one test stops it mid-run to
show what each ``budget_on_error`` does, and that no hop waits for a Redis that is gone.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import propagate
from redis_server import RedisServer, paused_under_probe
from test_budget import race_for_the_last_units, store_errors, store_errors_since

import otel_guard
from otel_guard import DelegationRefused, delegate
from otel_guard.budget import HOPS, WORKSPACE_HOPS, Meter, StoreError, store_for
from otel_guard.budget.redis_store import RedisStore
from otel_guard.policy import CLOCK_SKEW

pytestmark = pytest.mark.integration

PROGRAMS = Path(__file__).parent / "programs"
REPO = Path(__file__).resolve().parents[2]
BUDGET_HOPS = "otel_guard.budget.hops"


def counting_url(redis_server: RedisServer) -> str:
    """The store URL of the tests that count exactly: a take gets 2 s, not 0.25 (on a loaded machine
    a take past its deadline is refused, which these tests are not about; the deadline has tests of
    its own in test_budget_redis_bounds.py)."""
    return f"{redis_server.url}?socket_timeout=2"


def test_the_script_takes_all_meters_or_none(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    now = time.time()
    tree = Meter("tree:ws:a", 5, now + 60, HOPS)
    workspace = Meter("workspace:ws:60:1", 2, now + 30, WORKSPACE_HOPS)
    assert store.take([tree, workspace], now) == (1, 1)
    assert store.take([tree, workspace], now) == (2, 2)
    assert store.take([tree, workspace], now) == 1  # the workspace is spent: nothing is counted
    assert store.used("tree:ws:a", now) == 2
    client = redis_server.client()
    # Each count expires when its chain (or window) does.
    assert abs(client.pexpiretime("tree:ws:a") - int((now + 60) * 1000)) <= 1
    assert abs(client.pexpiretime("workspace:ws:60:1") - int((now + 30) * 1000)) <= 1
    client.close()
    store.close()


def test_a_tree_count_expires_with_its_chain(redis_server: RedisServer) -> None:
    otel_guard.configure(max_hops=10, budget_store=counting_url(redis_server), ttl=60)
    with delegate("planner") as planner:
        pass
    assert planner.chain is not None
    key = f"tree:default:{planner.chain.root}"
    client = redis_server.client()
    assert client.get(key) == b"1"
    expires_ms = client.pexpiretime(key)
    assert abs(expires_ms / 1000 - (planner.chain.expires_at + CLOCK_SKEW)) < 0.01
    client.close()


def test_twenty_threads_racing_through_redis_never_overshoot(redis_server: RedisServer) -> None:
    otel_guard.configure(max_hops=11, budget_store=counting_url(redis_server))
    allowed, refused = race_for_the_last_units(20)
    assert len(allowed) == 10
    assert refused == ["budget"] * 10


def spend_in_processes(
    redis_server: RedisServer, carrier: dict[str, str], processes: int, hops: int, **settings: str
) -> list[dict[str, Any]]:
    """Run ``processes`` copies of programs/spend_budget.py at once, each making ``hops`` hops."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "OTEL_GUARD_BUDGET_STORE": counting_url(redis_server),
        "OTEL_TRACES_EXPORTER": "none",
        **settings,
    }
    start_at = time.time() + 3.0  # every process is up before any spends
    running = []
    for index in range(processes):
        payload = json.dumps({"carrier": carrier, "prefix": f"p{index}w", "hops": hops, "start_at": start_at})
        process = subprocess.Popen(
            [sys.executable, str(PROGRAMS / "spend_budget.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        running.append((process, payload))
    results = []
    for process, payload in running:
        try:
            out, err = process.communicate(payload, timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == 0, err
        results.append(json.loads(out))
    return results


def test_two_processes_share_one_trees_budget_exactly(redis_server: RedisServer) -> None:
    """The planner here, two workers' processes there: 40 hops wanted, 25 in the budget, 25 made."""
    otel_guard.configure(max_hops=25, budget_store=counting_url(redis_server))
    carrier: dict[str, str] = {}
    with delegate("planner") as planner:  # hop 1 of 25, in this process
        propagate.inject(carrier)
    assert planner.span.attributes is not None
    assert planner.span.attributes[BUDGET_HOPS] == 1
    results = spend_in_processes(redis_server, carrier, processes=2, hops=20, OTEL_GUARD_MAX_HOPS="25")
    assert sum(r["allowed"] for r in results) == 24
    assert sum(r["refused"].get("budget", 0) for r in results) == 40 - 24
    seen = sorted(count for r in results for count in r["hop_counts"])
    assert seen == list(range(2, 26))  # every count from 2 to 25 handed out exactly once


def test_a_redis_outage_with_budget_on_error_allow_lets_hops_run_and_counts_the_errors(
    redis_server: RedisServer, metric_reader: Any
) -> None:
    otel_guard.configure(max_hops=100, budget_store=redis_server.url, budget_on_error="allow")
    with delegate("planner") as planner, delegate("budget") as before:
        pass
    assert before.span.attributes is not None
    assert before.span.attributes[BUDGET_HOPS] == 2
    redis_server.stop()
    before = store_errors(metric_reader)
    started = time.monotonic()
    for _ in range(20):
        with delegate("planner") as hop:  # new trees, while Redis is gone
            assert hop.decision == "allow"
    assert time.monotonic() - started < 2.0  # no hop waits for a Redis that is not there
    assert hop.span.attributes is not None
    assert BUDGET_HOPS not in hop.span.attributes  # nothing could be counted
    assert store_errors_since(before, metric_reader) == {"StoreError": 20}
    assert planner.chain is not None


def test_a_redis_outage_with_budget_on_error_refuse_refuses_and_recovers(redis_server: RedisServer) -> None:
    otel_guard.configure(max_hops=100, budget_store=redis_server.url, budget_on_error="refuse")
    with delegate("planner"):
        pass
    redis_server.stop()
    with pytest.raises(DelegationRefused) as refused, delegate("planner"):
        pass
    assert refused.value.reason == "budget"
    assert "could not be reached" in str(refused.value)
    redis_server.start()
    store = store_for(otel_guard.settings.current_settings())
    deadline = time.monotonic() + 5.0
    while True:  # the store asks Redis again once its pause after the failure is over
        try:
            with delegate("planner") as hop:
                break
        except DelegationRefused:
            assert time.monotonic() < deadline, "the store never came back"
            time.sleep(0.2)
    assert hop.span.attributes is not None
    assert hop.span.attributes[BUDGET_HOPS] == 1
    assert isinstance(store, RedisStore)


def test_a_store_that_failed_answers_at_once_until_its_pause_is_over(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)  # never started: nothing listens on its port
    store = RedisStore(server.url, down_for=60.0)
    meter = Meter("tree:ws:x", 5, time.time() + 60, HOPS)
    with pytest.raises(StoreError):
        store.take([meter], time.time())
    started = time.monotonic()
    for _ in range(100):
        with pytest.raises(StoreError, match="failed a moment ago"):
            store.take([meter], time.time())
    assert time.monotonic() - started < 0.5


async def test_async_hops_count_through_the_asyncio_client(redis_server: RedisServer) -> None:
    """``async with delegate(...)`` awaits the store: 20 branches of 3 hops, 30 in the budget."""
    otel_guard.configure(max_hops=30, budget_store=counting_url(redis_server))
    allowed: list[int] = []
    refused: list[str] = []

    async def branch(index: int) -> None:
        for step in range(3):
            try:
                async with delegate(f"w{index}", f"s{step}") as hop:
                    assert hop.span.attributes is not None
                    allowed.append(int(hop.span.attributes[BUDGET_HOPS]))
                    await asyncio.sleep(0)
            except DelegationRefused as err:
                refused.append(err.reason)

    async with delegate("planner"):
        await asyncio.gather(*(branch(i) for i in range(20)))
    assert sorted(allowed) == list(range(2, 31))
    assert refused == ["budget"] * (60 - 29)
    store = store_for(otel_guard.settings.current_settings())
    assert isinstance(store, RedisStore)
    assert asyncio.get_running_loop() in store._async_clients  # the asyncio client served them


async def test_an_async_hop_never_waits_for_a_redis_that_is_gone(redis_server: RedisServer) -> None:
    otel_guard.configure(max_hops=100, budget_store=redis_server.url, budget_on_error="allow")
    async with delegate("planner"):
        pass
    redis_server.stop()
    started = time.monotonic()
    for _ in range(20):
        async with delegate("planner") as hop:
            assert hop.decision == "allow"
    assert time.monotonic() - started < 2.0


def test_a_tree_spends_one_budget_across_an_http_hop_between_two_processes(redis_server: RedisServer) -> None:
    """planner (here) calls budget (another process, behind GuardMiddleware) over HTTP; budget's own
    hops count in the same tree: 6 hops in the budget, 2 spent here, 4 there, the rest refused."""
    import httpx
    from redis_server import free_port

    settings = {"OTEL_GUARD_BUDGET_STORE": counting_url(redis_server), "OTEL_GUARD_MAX_HOPS": "6"}
    otel_guard.configure(max_hops=6, budget_store=counting_url(redis_server))
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "OTEL_TRACES_EXPORTER": "none", **settings}
    server = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "budget_server.py"), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "READY", server.stderr.read() if server.stderr else ""
        with delegate("planner"), delegate("budget") as call:  # hops 1 and 2, counted here
            headers: dict[str, str] = {}
            propagate.inject(headers)
            reply = httpx.post(f"http://127.0.0.1:{port}/spend?hops=6", headers=headers, timeout=30)
        assert reply.status_code == 200, reply.text
        assert call.span.attributes is not None
        assert call.span.attributes[BUDGET_HOPS] == 2
        # The server's hop into budget continues the one made here: counted once, here.
        assert reply.json() == {"allowed": [3, 4, 5, 6], "refused": ["budget", "budget"]}
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


async def test_the_asgi_middleware_awaits_redis_and_the_event_loop_serves_on(
    redis_server: RedisServer,
) -> None:
    """A request's hop waits for a Redis that does not answer (at most the store's timeout) while
    the event loop goes on with everything else: the middleware awaits the asyncio client."""
    import httpx

    from otel_guard.asgi import GuardMiddleware

    otel_guard.configure(max_hops=100, budget_store=redis_server.probe_url, budget_on_error="allow")

    async def endpoint(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = GuardMiddleware(endpoint, agent="budget")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://agent") as client:
        assert (await client.post("/")).status_code == 200  # the asyncio client is connected
        async with paused_under_probe(redis_server) as probe:
            response = await client.post("/")
    assert response.status_code == 200  # budget_on_error=allow
    probe.assert_the_hop_waited_not_the_loop()


@pytest.mark.parametrize("on_error", ["allow", "refuse"])
async def test_an_agentic_async_generator_awaits_redis_and_the_event_loop_runs_on(
    redis_server: RedisServer, on_error: str
) -> None:
    """An ``@agentic`` async generator's hop starts at its first step, awaiting the store: a Redis
    that does not answer holds the hop (up to the store's timeout), never the event loop."""
    otel_guard.configure(max_hops=100, budget_store=redis_server.probe_url, budget_on_error=on_error)

    @otel_guard.agentic(name="planner")
    async def plan() -> AsyncIterator[str]:
        yield "day 1"
        yield "day 2"

    assert [day async for day in plan()] == ["day 1", "day 2"]  # the asyncio client is connected
    async with paused_under_probe(redis_server) as probe:
        if on_error == "allow":
            days = [day async for day in plan()]
        else:
            with pytest.raises(DelegationRefused) as refused:
                await anext(plan())
    probe.assert_the_hop_waited_not_the_loop()
    if on_error == "allow":
        assert days == ["day 1", "day 2"]
    else:
        assert refused.value.reason == "budget"
