"""Request headers as a propagator carrier: repeated headers joined in time linear in the input, and
``baggage`` bounded by the W3C limit before it is joined.

Times are compared with each other in the same test (a ratio), never with a number of seconds.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import httpx
import pytest

import otel_guard
from otel_guard._carriers import MAX_BAGGAGE_BYTES, carrier_from_headers
from otel_guard.asgi import GuardMiddleware
from tests.core.asgi_server import serving

VALUE = b"m=" + b"v" * 98  # a 100-byte header value (a valid baggage member)
RATIO = 2.5


def repeated(name: bytes, count: int) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"budget"),
        *[(name, VALUE)] * count,
        (b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),
    ]


def ratio_of_times(large: list[tuple[bytes, bytes]], small: list[tuple[bytes, bytes]]) -> float:
    """How many times as long ``carrier_from_headers`` takes on ``large`` as on ``small``: the least
    of seven timings of each (one, when it takes over a second: noise is small beside that), taken in
    turn, in this thread's CPU time (the other processes of a busy machine do not count), the garbage
    collector off while they run (its passes would fall in one timing or the other)."""
    best = {id(large): float("inf"), id(small): float("inf")}
    gc.collect()
    gc.disable()
    try:
        for _ in range(7):
            for headers in (small, large):
                started = time.thread_time()
                carrier_from_headers(headers)
                best[id(headers)] = min(best[id(headers)], time.thread_time() - started)
            if best[id(large)] > 1.0:
                break
    finally:
        gc.enable()
    return best[id(large)] / best[id(small)]


def test_repeated_headers_are_joined_by_commas_in_order() -> None:
    headers = [
        (b"Baggage", b"a=1"),
        (b"x-forwarded-for", b"10.0.0.1"),
        (b"baggage", b"b=2, c=3"),
        (b"X-Forwarded-For", b"10.0.0.2"),
        (b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),
        (b"baggage", b"otel_guard.chain=abc"),
    ]
    assert carrier_from_headers(headers) == {
        "baggage": "a=1,b=2, c=3,otel_guard.chain=abc",
        "x-forwarded-for": "10.0.0.1,10.0.0.2",
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    }


def test_baggage_up_to_the_w3c_limit_is_kept_whole() -> None:
    values = [b"m=" + b"v" * 98] * 81 + [b"m=" + b"v" * 9]  # 81 * 101 + 11 = 8192 bytes joined
    carrier = carrier_from_headers([(b"baggage", value) for value in values])
    assert len(carrier["baggage"]) == MAX_BAGGAGE_BYTES
    over = carrier_from_headers([(b"baggage", value) for value in [*values[:-1], b"m=" + b"v" * 10]])
    assert "baggage" not in over


@pytest.mark.parametrize("name", [b"baggage", b"x-padding"])
def test_joining_takes_time_linear_in_the_headers(name: bytes, caplog: pytest.LogCaptureFixture) -> None:
    small, large = repeated(name, 20_000), repeated(name, 40_000)
    ratio = ratio_of_times(large, small)
    assert ratio <= RATIO, f"40,000 headers took {ratio:.1f} times as long as 20,000"
    carrier = carrier_from_headers(large)
    assert carrier["host"] == "budget"
    assert carrier["traceparent"].startswith("00-")
    if name == b"baggage":
        assert "baggage" not in carrier  # 4 MB of baggage: over the limit, not read past it
        assert any("more than 8192 bytes" in r.getMessage() for r in caplog.records)
    else:
        assert carrier["x-padding"] == ",".join([VALUE.decode()] * 40_000)


@pytest.mark.integration
async def test_the_middleware_answers_a_request_of_20000_baggage_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        chain = otel_guard.current_chain()
        seen.append(None if chain is None else [list(hop) for hop in chain.hops])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    caplog.set_level(logging.WARNING)
    headers = [("baggage", VALUE.decode())] * 20_000
    with serving(
        GuardMiddleware(app, agent="budget"), lifespan="off", h11_max_incomplete_event_size=8 << 20
    ) as url:
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.get(f"{url}/price", headers=headers)
    assert response.status_code == 200
    assert seen == [[["budget", None]]]  # no chain arrived: a new tree
    warnings = [r.getMessage() for r in caplog.records if "baggage" in r.getMessage()]
    assert len(warnings) == 1  # one, of the guard's: the propagator never saw the header
    assert "more than 8192 bytes" in warnings[0]
