"""The processor's held detection state in bytes (``--max-held-bytes``), and eviction that keeps a
loop in progress ahead of one-span traces, each through the real processor over gRPC.

What a reader would not guess: the resident set is read from ``/proc/PID/status`` of the processor
process while it holds what was sent (no sweep runs before the TTL), so the bound is the state's,
not a moment after eviction by age.
"""

from __future__ import annotations

import asyncio
import os
import re

import grpc.aio
import httpx
import pytest
from processor_helpers import EXPORT, processor_process, ready_port
from processor_spans import Trace, encode, guard_attributes

HELD = 4 * 2**20  # --max-held-bytes in the RSS test: below what is sent (about 9 MiB)
SLACK = 48 * 2**20  # the metrics' series of the names sent, Python's heap, the requests in flight


def vm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        found = re.search(r"^VmRSS:\s+(\d+) kB", status.read(), re.MULTILINE)
    assert found
    return int(found.group(1)) * 1024


def long_name() -> str:
    """256 characters, 856 bytes: as long as a name is kept, mostly 4-byte characters."""
    return "\U0001d11e" * 200 + os.urandom(28).hex()


def chain_spans(count: int) -> bytes:
    """``count`` one-span traces, each a guard span whose chain holds 64 new long names."""
    spans = []
    for _ in range(count):
        agents = [long_name() for _ in range(64)]
        trace = Trace()
        spans.append(trace.agent(agents[-1], attributes=guard_attributes(agents)))
    return encode(*spans)


async def send(port: int, requests: list[bytes]) -> None:
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 16 * 2**20)]
    ) as channel:
        export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        for raw in requests:
            for _ in range(100):  # told to retry while detection catches up
                try:
                    await export(raw, timeout=30)
                    break
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the processor kept refusing")


def metric(text: str, pattern: str) -> float:
    found = re.search(pattern + r" ([0-9.e+]+)", text)
    return float(found.group(1)) if found else 0.0


@pytest.mark.integration
@pytest.mark.slow
def test_guard_spans_of_long_chains_of_long_names_hold_at_most_the_bound() -> None:
    # Before --max-held-bytes each such span held 143 KiB: 1,600 of them, 220 MiB.
    requests = [chain_spans(80) for _ in range(20)]
    # The requests waiting for detection are held within --max-pending-bytes: 32 MiB here, which
    # SLACK allows for (the default, 128 MiB, is for the whole budget of every holder).
    args = (
        "--prometheus",
        "127.0.0.1:0",
        "--max-held-bytes",
        str(HELD),
        "--max-pending-bytes",
        str(32 * 2**20),
    )
    with processor_process(*args) as (process, ready):
        grpc_port, metrics_port = ready_port(ready, "OTLP/gRPC"), ready_port(ready, "metrics")
        asyncio.run(send(grpc_port, requests[:2]))
        start = vm_rss(process.pid)
        asyncio.run(send(grpc_port, requests[2:]))
        end = vm_rss(process.pid)
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert metric(text, r'otel_guard_processor_trace_evictions_total\{reason="capacity"\}') > 0
    print(f"RSS {start / 2**20:.0f} -> {end / 2**20:.0f} MiB")
    assert end - start <= HELD + SLACK, (start // 2**20, end // 2**20)


def loop_parts() -> tuple[bytes, bytes]:
    """A loop planner > budget > planner: its first two spans, and its third."""
    trace = Trace()
    planner = trace.agent("planner")
    budget = trace.agent("budget", planner)
    again = trace.agent("planner", budget)
    return encode(planner, budget), encode(again)


def one_span_traces(count: int) -> bytes:
    return encode(*(Trace().agent("solo") for _ in range(count)))


@pytest.mark.integration
@pytest.mark.slow
def test_one_span_traces_between_a_loops_spans_do_not_evict_it() -> None:
    # The attack at --max-traces 1000: 5,200 one-span traces (52,000 at the default)
    # between the loop's second and third span.
    first, third = loop_parts()
    flood = [one_span_traces(520) for _ in range(10)]
    args = ("--prometheus", "127.0.0.1:0", "--max-traces", "1000", "--count-wait", "0")
    with processor_process(*args) as (_, ready):
        grpc_port, metrics_port = ready_port(ready, "OTLP/gRPC"), ready_port(ready, "metrics")
        asyncio.run(send(grpc_port, [first, *flood, third]))
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert metric(text, r'otel_guard_processor_trace_evictions_total\{reason="capacity"\}') >= 4_200
    cycles = re.findall(r"^otel_guard_cycles_total\{([^}]*)\} ([0-9.e+]+)$", text, re.MULTILINE)
    print(cycles)
    assert [(labels, float(value)) for labels, value in cycles] == [
        ('cycle="planner>budget>planner",kind="cross_function"', 1.0)
    ]
