"""A chain token sent again (a replay) to the receiving side of a hop: checked against every budget.

The receiving side of a hop its caller counted adds nothing to the tree's hop count; it claims one of
the tree's hops as received. A tree's hops are received at most as many times as it made them; past
that, a token sent again is counted as a new hop, so ``max_hops`` and ``workspace_max_hops`` refuse it
with reason ``budget``. The live tests serve a plain ASGI app behind ``GuardMiddleware`` on uvicorn
(127.0.0.1) and call it with httpx, with the memory store and with a real Redis.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import context, propagate
from opentelemetry.trace import SpanKind

import otel_guard
import otel_guard.budget
from otel_guard import delegate
from otel_guard.asgi import GuardMiddleware
from otel_guard.errors import DelegationRefused
from otel_guard.usage import after_model_request, before_model_request
from tests.core.asgi_server import serving
from tests.core.redis_server import RedisServer

EXHAUSTED = "otel_guard.budget.exhausted"
BUDGET_HOPS = "otel_guard.budget.hops"
REPLAYS = 20


def counting_app(runs: list[str]) -> GuardMiddleware:
    """The agent ``budget``: its skill is the request's path; ``runs`` gets the path of every run."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        runs.append(scope["path"])
        body = json.dumps({"ran": len(runs)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return GuardMiddleware(app, agent="budget", skill=lambda scope: scope["path"].strip("/") or None)


@pytest.fixture
def app_url() -> Iterator[tuple[str, list[str]]]:
    runs: list[str] = []
    with serving(counting_app(runs), lifespan="off") as url:
        yield url, runs


def sent() -> dict[str, str]:
    """The headers a call from the current hop carries (what a peer on the path can capture)."""
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


async def post(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> httpx.Response:
    return await client.post(url, headers=headers, content=b"{}")


async def replays(client: httpx.AsyncClient, url: str, headers: dict[str, str], times: int) -> list[Any]:
    """What each of ``times`` replays of ``headers`` got: 200, or the refusal's reason."""
    answers = []
    for _ in range(times):
        response = await post(client, url, headers)
        answers.append(
            200 if response.status_code == 200 else (response.status_code, response.json()["reason"])
        )
    return answers


# -- live: GuardMiddleware on uvicorn --------------------------------------------------------------


async def spend_a_tree_by_calling_the_app(client: httpx.AsyncClient, url: str) -> list[dict[str, str]]:
    """A tree of max_hops=2 whose both hops are calls into the app: spent, and each hop received."""
    with delegate("budget", "price"):  # hop 1: the caller's instrumentation counts it
        first = sent()
        assert (await post(client, f"{url}/price", first)).status_code == 200
        with delegate("budget", "quote"):  # hop 2
            second = sent()
        assert (await post(client, f"{url}/quote", second)).status_code == 200
    return [first, second]


@pytest.mark.integration
async def test_a_token_replayed_after_its_tree_is_spent_is_refused_every_time(
    app_url: tuple[str, list[str]], spans: Any
) -> None:
    url, runs = app_url
    otel_guard.configure(max_hops=2)
    async with httpx.AsyncClient(timeout=30) as client:
        first, second = await spend_a_tree_by_calling_the_app(client, url)
        assert await replays(client, f"{url}/price", first, REPLAYS) == [(409, "budget")] * REPLAYS
        assert await replays(client, f"{url}/quote", second, REPLAYS) == [(409, "budget")] * REPLAYS
    assert runs == ["/price", "/quote"]  # the app ran once a hop, never for a replay
    # The app's received hops that refused (the caller's own two were allowed).
    refused = [
        s
        for s in spans.named("invoke_agent budget")
        if s.attributes and s.attributes.get("otel_guard.decision") == "refuse" and s.status.is_ok is False
    ]
    assert len(refused) == 2 * REPLAYS
    assert {s.attributes[EXHAUSTED] for s in refused if s.attributes} == {"hops"}


@pytest.mark.integration
async def test_replays_get_no_more_runs_than_the_tree_has_hops(app_url: tuple[str, list[str]]) -> None:
    """Hops the caller made in its own process (none of them received) are all a replay can claim:
    the app runs max_hops times in all, however often the token is sent."""
    url, runs = app_url
    otel_guard.configure(max_hops=4)
    async with httpx.AsyncClient(timeout=30) as client:
        with delegate("planner"):  # hop 1
            with delegate("budget", "price"):  # hop 2, into the app
                captured = sent()
                assert (await post(client, f"{url}/price", captured)).status_code == 200
            for agent in ("fx", "ledger"):  # hops 3 and 4, in the caller's process: the tree is spent
                with delegate(agent):
                    pass
        answers = await replays(client, f"{url}/price", captured, REPLAYS)
    assert answers == [200, 200, 200] + [(409, "budget")] * (REPLAYS - 3)
    assert len(runs) == 4


@pytest.mark.integration
async def test_a_token_replayed_after_the_workspace_window_is_spent_is_refused(
    app_url: tuple[str, list[str]], spans: Any
) -> None:
    url, runs = app_url
    otel_guard.configure(max_hops=0, workspace_max_hops=2, workspace_window=3600)
    async with httpx.AsyncClient(timeout=30) as client:
        captured = []
        for _ in range(2):  # two trees of one hop each, into the app: the window is spent
            with delegate("budget", "price"):
                captured.append(sent())
                assert (await post(client, f"{url}/price", captured[-1])).status_code == 200
        for headers in captured:
            assert await replays(client, f"{url}/price", headers, REPLAYS) == [(409, "budget")] * REPLAYS
    assert runs == ["/price", "/price"]
    # The app's received hops that refused (the caller's own two were allowed).
    refused = [
        s
        for s in spans.named("invoke_agent budget")
        if s.attributes and s.attributes.get("otel_guard.decision") == "refuse" and s.status.is_ok is False
    ]
    assert {s.attributes[EXHAUSTED] for s in refused if s.attributes} == {"workspace_hops"}


@pytest.mark.integration
async def test_a_replay_through_a_shared_redis_is_refused(
    app_url: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, runs = app_url
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        otel_guard.configure(max_hops=2, budget_store=redis.url)
        async with httpx.AsyncClient(timeout=30) as client:
            first, _ = await spend_a_tree_by_calling_the_app(client, url)
            assert await replays(client, f"{url}/price", first, REPLAYS) == [(409, "budget")] * REPLAYS
        assert runs == ["/price", "/quote"]
        client_of_redis = redis.client()
        try:
            root = next(key for key in client_of_redis.keys("tree:*") if key.endswith(b":received"))
            tree = root.removesuffix(b":received")
            assert client_of_redis.get(tree) == b"2"  # the tree's two hops, counted once each
            assert client_of_redis.get(root) == b"2"  # both received, no replay counted
        finally:
            client_of_redis.close()
    finally:
        otel_guard.budget.reset_stores()
        redis.stop()


# -- in process: delegate(receiving=True) ---------------------------------------------------------


@contextlib.contextmanager
def arrived(carrier: dict[str, str]) -> Iterator[None]:
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def receive(carrier: dict[str, str], agent: str, skill: str | None = None) -> Any:
    with arrived(carrier), delegate(agent, skill, receiving=True, span_kind=SpanKind.SERVER) as hop:
        return hop


def test_a_received_hop_checks_its_trees_tokens() -> None:
    otel_guard.configure(max_tokens=100)
    with delegate("planner"), delegate("budget"):
        carrier = sent()
        assert before_model_request() is None
        after_model_request(100)  # the caller's model spends the tree's tokens
    with pytest.raises(DelegationRefused) as refused:
        receive(carrier, "budget")
    assert refused.value.reason == "budget"
    assert "has spent its 100 model tokens" in str(refused.value)


def test_a_received_hop_checks_its_trees_model_requests() -> None:
    otel_guard.configure(max_model_requests=1)
    with delegate("planner"), delegate("budget"):
        carrier = sent()
        assert before_model_request() is None  # the tree's one model request
    with pytest.raises(DelegationRefused) as refused:
        receive(carrier, "budget")
    assert refused.value.reason == "budget"
    assert "has made its 1 model requests" in str(refused.value)


def test_a_received_hop_is_claimed_once_and_a_replay_counted_as_a_new_hop() -> None:
    otel_guard.configure(max_hops=3)
    with delegate("planner"), delegate("budget"):  # hops 1 and 2
        carrier = sent()
    received = receive(carrier, "budget")  # hop 2 received: nothing added
    assert received.span.attributes[BUDGET_HOPS] == 2
    replayed = receive(carrier, "budget")  # hop 1 is still unclaimed: claimed, nothing added
    assert replayed.span.attributes[BUDGET_HOPS] == 2
    counted = receive(carrier, "budget")  # nothing left to claim: counted, the tree's third hop
    assert counted.span.attributes[BUDGET_HOPS] == 3
    with pytest.raises(DelegationRefused) as refused:
        receive(carrier, "budget")
    assert refused.value.reason == "budget"
    assert "has made its 3 hops (max_hops 3) and each has been received" in str(refused.value)


def test_a_server_that_names_no_skill_claims_the_hop_of_any_skill_like_any_other() -> None:
    otel_guard.configure(max_hops=1)
    with delegate("budget", "price"):
        carrier = sent()
    assert receive(carrier, "budget").chain.hops[-1] == ("budget", "price")
    with pytest.raises(DelegationRefused) as refused:
        receive(carrier, "budget")
    assert refused.value.reason == "budget"


def test_a_hop_counted_in_another_store_is_counted_here(spans: Any) -> None:
    """The memory store of the caller's process is not this one: the tree has nothing here to claim,
    so each hop received here counts here, against max_hops."""
    otel_guard.configure(max_hops=2)
    with delegate("planner"), delegate("budget"):
        carrier = sent()
    otel_guard.budget.reset_stores()  # the server's own memory store
    assert receive(carrier, "budget").span.attributes[BUDGET_HOPS] == 1
    assert receive(carrier, "budget").span.attributes[BUDGET_HOPS] == 2
    with pytest.raises(DelegationRefused):
        receive(carrier, "budget")


def test_observe_mode_lets_a_replay_past_the_budget_through_as_would_refuse() -> None:
    otel_guard.configure(max_hops=1, mode="observe")
    with delegate("budget"):
        carrier = sent()
    assert receive(carrier, "budget").decision == "allow"
    replayed = receive(carrier, "budget")
    assert replayed.decision == "would_refuse"
    assert replayed.span.attributes[EXHAUSTED] == "hops"
