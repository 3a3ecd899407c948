"""Jaeger, the trace store the processor's exemplars are opened in: the ``jaeger`` binary (v1.75.0, the
Collector-based Jaeger v2) that ``scripts/build-jaeger`` builds from its Go module, started on
127.0.0.1 with a config of the test's and stopped by it.

Every address is a free port of its own, never the binary's defaults (4317, 16686, 13133, 8888, ...),
which other tests' servers or another engineer's Jaeger may hold; the Collector's own telemetry is
off, and so is the query service's tracing of itself (``enable_tracing``, on by default in v2): it
would send Jaeger's own spans over OTLP to 127.0.0.1:4317, wherever that is, and wait 10 s at the
stop to flush them. Memory storage: what a test stored goes with the process.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "v1.75.0"
BINARY = ROOT / ".jaeger" / f"jaeger-{RELEASE}"
WAIT = 30.0  # to start; and for spans to be found


def jaeger_binary() -> str:
    """The built Jaeger; its absence is a failure that says how to build it, never a skip."""
    if not BINARY.exists():
        raise AssertionError(
            f"{BINARY} is missing: scripts/build-jaeger builds it (it needs Go; scripts/bootstrap runs it)"
        )
    return str(BINARY)


def attributes(kvs: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON attributes as plain values (string arrays as lists, ints as ints)."""

    def plain(value: dict[str, Any]) -> Any:
        if "arrayValue" in value:
            return [plain(item) for item in value["arrayValue"].get("values", [])]
        if "intValue" in value:
            return int(value["intValue"])
        (found,) = value.values()
        return found

    return {kv["key"]: plain(kv["value"]) for kv in kvs}


class JaegerStore:
    """One Jaeger: OTLP/gRPC in at :attr:`otlp`, its query APIs at :attr:`query`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.otlp = f"127.0.0.1:{free_port()}"
        self.query = f"http://127.0.0.1:{free_port()}"
        self.health = f"http://127.0.0.1:{free_port()}"
        self.query_grpc = f"127.0.0.1:{free_port()}"
        self.log = tmp_path / "jaeger.log"
        self.process: subprocess.Popen[bytes] | None = None

    def config(self) -> dict[str, Any]:
        return {
            "service": {
                "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                "pipelines": {
                    "traces": {
                        "receivers": ["otlp"],
                        "processors": [],
                        "exporters": ["jaeger_storage_exporter"],
                    }
                },
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
            },
            "extensions": {
                "healthcheckv2": {"use_v2": True, "http": {"endpoint": self.health.removeprefix("http://")}},
                "jaeger_query": {
                    "storage": {"traces": "memstore"},
                    "enable_tracing": False,
                    "http": {"endpoint": self.query.removeprefix("http://")},
                    "grpc": {"endpoint": self.query_grpc},
                },
                "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 10000}}}},
            },
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": self.otlp}}}},
            "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
        }

    def start(self) -> None:
        path = self.tmp_path / "jaeger.yaml"
        path.write_text(yaml.safe_dump(self.config()), encoding="utf-8")
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [jaeger_binary(), f"--config={path}"], stdout=subprocess.DEVNULL, stderr=log
            )

    async def ready(self) -> None:
        """Wait, at most :data:`WAIT` s, until its health check says every component is up."""
        deadline = time.monotonic() + WAIT
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                assert self.process is not None
                assert self.process.poll() is None, f"Jaeger exited:\n{self.log.read_text()}"
                try:
                    response = await client.get(f"{self.health}/status", timeout=2)
                    if response.status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"Jaeger was not healthy within {WAIT} s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    async def get(self, path: str, **params: str) -> Any:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{self.query}{path}", params=params, timeout=10)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    async def trace_spans(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans of one trace, by the API v3 (``/api/v3/traces/{id}``: OTLP/JSON); none if unknown."""
        found = await self.get(f"/api/v3/traces/{trace_id}")
        if found is None:
            return []
        return [
            span
            for resource_spans in found["result"]["resourceSpans"]
            for scope_spans in resource_spans["scopeSpans"]
            for span in scope_spans["spans"]
        ]

    async def wait_for_spans(self, trace_id: str, count: int) -> list[dict[str, Any]]:
        """The trace's spans once it has ``count`` of them (at most :data:`WAIT` s)."""
        deadline = time.monotonic() + WAIT
        while len(spans := await self.trace_spans(trace_id)) < count:
            assert time.monotonic() < deadline, f"trace {trace_id}: {len(spans)} spans of {count} in Jaeger"
            await asyncio.sleep(0.1)
        return spans

    async def find_by_tag(self, service: str, key: str, value: str) -> list[dict[str, Any]]:
        """The traces of ``service`` that hold a span with the tag ``key`` = ``value``: the search of
        Jaeger's UI (its API v1, ``/api/traces?service=...&tags={...}``; API v3's HTTP search takes no
        attributes in this release). Each trace as that API gives it: ``traceID``, ``spans``."""
        now = time.time()
        found = await self.get(
            "/api/traces",
            service=service,
            tags=json.dumps({key: value}),
            start=str(int((now - 3600) * 1e6)),
            end=str(int((now + 60) * 1e6)),
            limit="100",
        )
        assert found is not None
        return list(found["data"])
