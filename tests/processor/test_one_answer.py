"""One answer for one request whatever the load: a request whose agent name (a string the engine
reads) is not UTF-8 is INVALID_ARGUMENT / 400 when the processor is idle and while another request is
in detection, over gRPC and HTTP, forwarded neither time and never a detection error."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import httpx
import pytest
from google.rpc import status_pb2  # type: ignore[import-untyped]
from otel_guard_processor.service import Processor
from processor_helpers import ProcessorFactory, Sink, export, http_url
from processor_spans import Trace, encode
from test_flood import fresh, traffic

PLACEHOLDER = "planner-XXXX"


def unreadable(where: str) -> bytes:
    """A one-span request with bytes that are not UTF-8 in a string the engine reads."""
    trace = Trace()
    if where == "span name":
        trace.span(PLACEHOLDER)
    else:
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": PLACEHOLDER}
        trace.span("invoke_agent", attributes=attributes)
    raw = encode(*trace.spans)
    assert raw.count(PLACEHOLDER.encode()) == 1
    return raw.replace(PLACEHOLDER.encode(), b"planner-\xff\xfe\xfd\xfc")


async def answers(processor: Processor, raw: bytes) -> tuple[str, int]:
    """The gRPC status and the HTTP status of the same request."""
    try:
        await export(processor, raw)
        grpc_answer, details = "OK", ""
    except grpc.aio.AioRpcError as error:
        grpc_answer, details = error.code().name, error.details() or ""
    assert grpc_answer == "OK" or "not UTF-8" in details, details
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(
            http_url(processor), content=raw, headers={"Content-Type": "application/x-protobuf"}
        )
    if response.status_code == 400:
        assert "not UTF-8" in status_pb2.Status.FromString(response.content).message
    return grpc_answer, response.status_code


@pytest.mark.parametrize("where", ["agent name", "span name"])
async def test_an_unreadable_request_gets_one_answer_idle_or_loaded(
    start_processor: ProcessorFactory, sink: Sink, where: str
) -> None:
    processor = await start_processor(forward=sink.address)
    raw = unreadable(where)

    idle = await answers(processor, raw)

    # Loaded: detection is on a large request (more than a megabyte: detected on the worker
    # thread), and held there until the answers are in, so every request meanwhile is queued.
    held = asyncio.Event()
    holding = asyncio.create_task(processor.detection.run(held.wait))
    large, ids = traffic(3000)
    assert len(large) > 1 << 20
    await export(processor, fresh(large, ids), timeout=30)
    loaded = await answers(processor, raw)
    held.set()
    await holding
    await processor.detection.settled()

    assert idle == loaded == ("INVALID_ARGUMENT", 400)
    assert processor.stats.detection_errors == 0
    assert len(sink.received) == 1  # the large request alone went on
