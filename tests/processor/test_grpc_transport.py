"""The OTLP/gRPC receiver's transport (the engine's HTTP/2 server) seen from real gRPC clients: a
method it does not serve, a client that gives up, a stop with calls in flight, every address a
host name resolves to.

Malformed framing (a compressed flag without ``grpc-encoding``, an encoding it does not read, a
message cut short) is tested against the server itself, in processor/tests/grpc_server.rs.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from dataclasses import replace

import grpc
import grpc.aio
import pytest
from otel_guard_processor.config import ProcessorConfig
from otel_guard_processor.service import Processor
from processor_helpers import EXPORT, ProcessorFactory, Sink, export, grpc_address
from processor_spans import Trace, encode


def small_request() -> bytes:
    trace = Trace()
    trace.agent("budget", trace.agent("planner"))
    return encode(*trace.spans)


async def until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def forwarding_only(sink: Sink, drain_timeout: float) -> Processor:
    """A started processor with only its gRPC receiver, forwarding to ``sink``; the test stops it
    (its stop is what these tests watch)."""
    config = replace(ProcessorConfig(), listen="127.0.0.1:0", http_listen=None, prometheus=None,
                     forward=sink.address, drain_timeout=drain_timeout, count_wait=0.0)  # fmt: skip
    processor = Processor(config)
    await processor.start()
    return processor


async def test_a_method_it_does_not_serve_is_unimplemented(start_processor: ProcessorFactory) -> None:
    processor = await start_processor()
    async with grpc.aio.insecure_channel(grpc_address(processor)) as channel:
        call = channel.unary_unary(
            "/some.Service/Export", request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"", timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert processor.stats.inflight == 0


async def test_a_client_that_gives_up_cancels_its_call(start_processor: ProcessorFactory, sink: Sink) -> None:
    """Its deadline passes while the downstream is slow: the client resets the call, and the
    processor stops waiting for it (its requests in flight fall to 0 before the sink answers)."""
    sink.delay = 3.0
    processor = await start_processor(forward=sink.address)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await export(processor, small_request(), timeout=0.3)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await until(lambda: processor.stats.inflight == 0, seconds=2.0)
    assert sink.received == []  # the sink has not answered yet: the call was let go of, not answered


async def test_stop_answers_the_calls_in_flight_and_takes_no_new_ones(sink: Sink) -> None:
    sink.delay = 0.5
    processor = await forwarding_only(sink, drain_timeout=5.0)
    address = grpc_address(processor)
    in_flight = asyncio.create_task(export(processor, small_request()))
    await asyncio.wait_for(sink.arrived.wait(), 5)
    stopping = asyncio.create_task(processor.stop())
    assert await in_flight == b""  # answered with the sink's answer, during the drain
    await stopping
    assert len(sink.received) == 1
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(small_request(), timeout=2)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_call_the_drain_does_not_wait_for_is_answered_unavailable(sink: Sink) -> None:
    """Past ``drain_timeout`` the call still waiting is answered with a status the client retries."""
    sink.delay = 5.0
    processor = await forwarding_only(sink, drain_timeout=0.3)
    in_flight = asyncio.create_task(export(processor, small_request()))
    await asyncio.wait_for(sink.arrived.wait(), 5)
    started = time.monotonic()
    await processor.stop()
    assert time.monotonic() - started < 3.0
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await in_flight
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


async def test_it_listens_on_every_address_the_host_resolves_to() -> None:
    processor = Processor(replace(ProcessorConfig(), listen="localhost:0", http_listen=None, prometheus=None))
    await processor.start()
    assert processor.grpc is not None
    addresses = {info[4][0] for info in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    if "::1" in addresses and not _has_ipv6_loopback():
        addresses.discard("::1")
    for host in addresses:
        target = f"[{host}]:{processor.grpc.port}" if ":" in host else f"{host}:{processor.grpc.port}"
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            assert await call(small_request(), timeout=5) == b""
    await processor.stop()
