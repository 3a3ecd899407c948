"""``--forward-headers``: a request's headers of these names travel with its spans to the downstream
(a multi-tenant back end's ``x-scope-orgid`` and ``authorization``), from OTLP/gRPC metadata and
from OTLP/HTTP headers, and joined sends join only requests whose forwarded headers are equal.
The downstream is a real gRPC server recording each call's metadata. Before issue 42 the
downstream got none of them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import httpx
import pytest
from otel_guard_processor.config import ConfigError, load_config
from otel_guard_processor.forwarder import METHODS
from processor_helpers import ProcessorFactory, grpc_address, http_url
from processor_spans import Trace, encode

FORWARDED = ("x-scope-orgid", "authorization")
SECRET = "Bearer s3cr3t-token-of-tenant-a"


class Recorder:
    """A downstream of every OTLP signal: each call's request bytes and the metadata it came with."""

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, dict[str, list[str]]]] = []
        self.delay = 0.0
        self.arrived = asyncio.Event()
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self.port = 0

    async def start(self) -> None:
        handlers = {}
        for method in METHODS:
            service, name = method.strip("/").split("/")
            handlers.setdefault(service, {})[name] = grpc.unary_unary_rpc_method_handler(self._export)
        self._server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(service, methods)
                for service, methods in handlers.items()
            )
        )
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()

    async def _export(self, raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        metadata: dict[str, list[str]] = {}
        for key, value in context.invocation_metadata() or ():
            metadata.setdefault(key, []).append(value if isinstance(value, str) else value.decode())
        self.calls.append((raw, metadata))
        self.arrived.set()
        await asyncio.sleep(self.delay)
        return b""


@pytest.fixture
async def recorder() -> AsyncIterator[Recorder]:
    downstream = Recorder()
    await downstream.start()
    yield downstream
    await downstream._server.stop(None)


def _request(name: str) -> bytes:
    trace = Trace()
    trace.agent(name)
    return encode(*trace.spans)


async def _send_grpc(address: str, raw: bytes, metadata: tuple[tuple[str, str], ...]) -> bytes:
    async with grpc.aio.insecure_channel(address) as channel:
        export = channel.unary_unary(METHODS[0], request_serializer=None, response_deserializer=None)
        response: bytes = await export(raw, metadata=metadata, timeout=10)
        return response


async def test_grpc_metadata_and_http_headers_of_these_names_reach_the_downstream(
    recorder: Recorder, start_processor: ProcessorFactory, caplog: pytest.LogCaptureFixture
) -> None:
    processor = await start_processor(forward=f"127.0.0.1:{recorder.port}", forward_headers=FORWARDED)
    over_grpc = _request("over_grpc")
    sent = (("x-scope-orgid", "tenant-a"), ("authorization", SECRET), ("x-not-forwarded", "no"))
    assert await _send_grpc(grpc_address(processor), over_grpc, sent) == b""
    over_http = _request("over_http")
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=over_http,
            headers={"content-type": "application/x-protobuf", "X-Scope-OrgID": "tenant-b", "X-Other": "no"},
        )
    assert response.status_code == 200
    (grpc_raw, grpc_metadata), (http_raw, http_metadata) = recorder.calls
    assert (grpc_raw, http_raw) == (over_grpc, over_http)
    assert grpc_metadata["x-scope-orgid"] == ["tenant-a"]
    assert grpc_metadata["authorization"] == [SECRET]
    assert "x-not-forwarded" not in grpc_metadata
    assert http_metadata["x-scope-orgid"] == ["tenant-b"]
    assert "authorization" not in http_metadata
    assert "x-other" not in http_metadata
    assert SECRET not in caplog.text


async def test_without_the_option_no_header_is_forwarded(
    recorder: Recorder, start_processor: ProcessorFactory
) -> None:
    processor = await start_processor(forward=f"127.0.0.1:{recorder.port}")
    await _send_grpc(grpc_address(processor), _request("a"), (("x-scope-orgid", "tenant-a"),))
    ((_, metadata),) = recorder.calls
    assert "x-scope-orgid" not in metadata


async def test_joined_sends_join_only_requests_of_equal_headers(
    recorder: Recorder, start_processor: ProcessorFactory
) -> None:
    recorder.delay = 0.5  # the first send is in flight while the others arrive: they wait, to be joined
    processor = await start_processor(forward=f"127.0.0.1:{recorder.port}", forward_headers=FORWARDED)
    address = grpc_address(processor)
    first = asyncio.ensure_future(_send_grpc(address, _request("first"), (("x-scope-orgid", "a"),)))
    await asyncio.wait_for(recorder.arrived.wait(), 10)
    tenants = ["a", "b", "a", "b", "a", "b"]
    requests = [_request(f"r{n}") for n in range(len(tenants))]
    sends = [
        _send_grpc(address, raw, (("x-scope-orgid", tenant), ("authorization", f"key-{tenant}")))
        for raw, tenant in zip(requests, tenants, strict=True)
    ]
    await asyncio.gather(first, *sends)
    tenant_of = dict(zip(requests, tenants, strict=True))
    joined = 0
    seen = []
    for raw, metadata in recorder.calls[1:]:
        (tenant,) = metadata["x-scope-orgid"]
        assert metadata["authorization"] == [f"key-{tenant}"]
        parts = [request for request in requests if request in raw]
        assert parts, "a send of requests not sent"
        assert sum(map(len, parts)) == len(raw)  # the send is these requests joined, nothing else
        assert {tenant_of[part] for part in parts} == {tenant}, (
            "a request went under another tenant's headers"
        )
        joined = max(joined, len(parts))
        seen += parts
    assert sorted(seen) == sorted(requests)  # each request sent once
    assert joined >= 2  # requests of equal headers are still joined


async def test_a_value_grpc_metadata_cannot_carry_is_refused_without_the_value(
    recorder: Recorder, start_processor: ProcessorFactory
) -> None:
    processor = await start_processor(forward=f"127.0.0.1:{recorder.port}", forward_headers=FORWARDED)
    async with httpx.AsyncClient() as client:
        response = await client.post(
            http_url(processor),
            content=_request("a"),
            headers={
                "content-type": "application/x-protobuf",
                "x-scope-orgid": "caf\xe9-tenant".encode("latin-1"),
            },
        )
    assert response.status_code == 400
    assert "x-scope-orgid" in response.text
    assert "tenant" not in response.text
    assert recorder.calls == []


def test_the_option_takes_header_names() -> None:
    config = load_config({"forward_headers": "X-Scope-OrgID, authorization"}, environ={})
    assert config.forward_headers == ("x-scope-orgid", "authorization")
    environ = {"OTEL_GUARD_PROCESSOR_FORWARD_HEADERS": "x-scope-orgid"}
    assert load_config({}, environ=environ).forward_headers == ("x-scope-orgid",)
    assert load_config({}, environ={}).forward_headers is None
    refused = [("content-type", "own header"), ("grpc-timeout", "own header"), ("x-trace-bin", "own header"),
               ("bad header", "not a header name"), (":authority", "not a header name")]  # fmt: skip
    for wrong, why in refused:
        with pytest.raises(ConfigError, match=r"forward_headers \(from flag --forward-headers\): .*" + why):
            load_config({"forward_headers": wrong}, environ={})
