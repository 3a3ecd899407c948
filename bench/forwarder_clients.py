"""The forwarder on grpcio next to the forwarder on the engine's own gRPC client, in one run.

The engine's client (``GrpcChannel``, cargo feature ``h2-forwarder``) is a prototype weighed for
issue 41 (docs/processor.md, *The forwarder's client*); build the engine with it first:
``cargo build --release --features python,h2-forwarder`` in ``processor/``.

Each round runs one process per arm, in turn (``grpcio``, then ``engine``, the order swapped every
other round), each driving ``otel_guard_processor.forwarder.Forwarder`` on an event loop as the
pipeline does, to a sink that acknowledges every call unread (the engine's HTTP/2 server, in a process of its
own, so that the arm sets the pace; the arm counts the spans acknowledged). Two ways of driving it:

* ``forwarder``: ``--concurrency`` requests at once through ``Forwarder.start`` (joined into
  sends of up to 4 MiB while one is in flight, as the service forwards);
* ``calls``: the same requests each its own downstream call (``Forwarder._deliver``: no join),
  which shows the clients' own cost a call; ``calls-large``: 8 at once of ten times the traces
  (about 1.5 MB each), several large streams on the one connection.

The requests are made before the clock starts (``--traces`` guarded traces each, new ids in each
of 256), so the arm's CPU is the forwarder's and its client's. Per round and arm: spans/s, the
arm process's CPU (every thread: grpcio's and the engine's included) a span, and the ratio
engine / grpcio of the two. Then the bytes a request in flight holds in each client: 32 requests
of 1 MiB sent to a downstream that answers HTTP/2's handshake and then reads nothing (no window
update), each arm's resident growth over the 32 once they are all started. Last, the sizes of
two extensions when given (``--sizes base.so feature.so``, stripped copies compared).

Usage: python bench/forwarder_clients.py [--rounds 8] [--seconds 3] [--concurrency 64] [--traces 40]
       [--pin] [--sizes BASE FEATURE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _processor_traffic import guarded
from otel_guard_processor.forwarder import Forwarder
from processor_throughput import Cores, free_port, on, server

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
ARMS: tuple[str, ...] = ("grpcio", "engine")


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _drive(
    client: str, target: str, how: str, seconds: float, concurrency: int, traces: int
) -> dict[str, float]:
    template = guarded(traces)
    requests = [template.next() for _ in range(256)]
    forwarder = Forwarder(
        target, timeout=10.0, max_inflight=4 * concurrency, max_message_bytes=64 << 20, client=client
    )
    lane = forwarder._lanes[next(iter(forwarder._lanes))]
    spans = 0
    counting = False
    stop = False

    async def sender(turn: int) -> None:
        nonlocal spans
        while not stop:
            raw, count = requests[turn % len(requests)]
            turn += concurrency
            if how == "forwarder":
                await forwarder.start(raw)
            else:
                await forwarder._deliver(lane, raw)
            if counting:
                spans += count

    senders = [asyncio.create_task(sender(turn)) for turn in range(concurrency)]
    await asyncio.sleep(0.5)  # warm: connected, buffers grown
    counting = True
    cpu, started = _cpu(), time.perf_counter()
    await asyncio.sleep(seconds)
    counting = False
    wall, used = time.perf_counter() - started, _cpu() - cpu
    stop = True
    await asyncio.gather(*senders)
    await forwarder.close()
    return {"spans_per_s": spans / wall, "cpu_us_per_span": 1e6 * used / spans, "busy": used / wall}


async def _held(client: str, target: str, requests: int, size: int) -> dict[str, float]:
    raws = [os.urandom(size) for _ in range(requests)]
    forwarder = Forwarder(
        target, timeout=30.0, max_inflight=requests, max_message_bytes=64 << 20, client=client
    )
    lane = forwarder._lanes[next(iter(forwarder._lanes))]
    # One call first, so that the connection (and grpcio's threads) exist before the baseline.
    warm = asyncio.create_task(forwarder._deliver(lane, b"\n\x00"))
    await asyncio.sleep(1.0)
    before = _resident()
    sends = [asyncio.create_task(forwarder._deliver(lane, raw)) for raw in raws]
    await asyncio.sleep(2.0)
    grown = _resident() - before
    for send in [warm, *sends]:
        send.cancel()
    await forwarder.close()
    await asyncio.gather(warm, *sends, return_exceptions=True)
    return {"held_per_request": grown / requests, "request": size}


def stall(port: int) -> None:
    """A downstream that completes HTTP/2's handshake and then takes nothing: it reads and drops
    every byte, and never grants a window, so a client holds what it has not sent."""
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # SETTINGS, empty
    ack = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"  # SETTINGS ACK

    def serve(connection: socket.socket) -> None:
        with connection:
            connection.sendall(settings)
            acked = False
            while connection.recv(1 << 16):
                if not acked:  # the client's preface and SETTINGS came
                    connection.sendall(ack)
                    acked = True

    with socket.create_server(("127.0.0.1", port)) as listener:
        print("ready", flush=True)
        while True:
            connection, _ = listener.accept()
            threading.Thread(target=serve, args=(connection,), daemon=True).start()


def sink(port: int) -> None:
    """A downstream that acknowledges every call at once, reading nothing in it (the engine's
    HTTP/2 server): cheaper a span than the counting sink, so that the arm, not it, sets the pace."""
    from otel_guard_processor._engine import GrpcServer

    listening = GrpcServer(["127.0.0.1"], port, 64 << 20, max_held_bytes=1 << 30)

    def take() -> None:
        calls, _ = listening.take()
        for _, _, _, reply in calls:
            reply.ok(b"")

    async def serve() -> None:
        listening.start()
        asyncio.get_running_loop().add_reader(listening.wake_fd(), take)
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


def _arm(args: list[str], cpus: frozenset[int] | None) -> dict[str, float]:
    command = on(cpus, [PYTHON, str(HERE / "forwarder_clients.py"), *args])
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=HERE.parent, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{args} failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _stripped(path: str) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "engine.so"
        shutil.copy(path, copy)
        subprocess.run(["strip", "--strip-all", str(copy)], check=True)
        return copy.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--traces", type=int, default=40)
    parser.add_argument("--pin", action="store_true", help="each arm on one core, the sink on the others")
    parser.add_argument("--sizes", nargs=2, metavar=("BASE", "FEATURE"))
    parser.add_argument("--skip-held", action="store_true")
    parser.add_argument("--tonic", action="store_true", help="a third arm: the engine's client on tonic")
    args = parser.parse_args()
    arms = ARMS + (("tonic",) if args.tonic else ())
    cores = Cores.pinned() if args.pin else Cores.shared()
    print(
        f"forwarder clients: {cores.describe()}; {args.rounds} rounds of {args.seconds:g} s, "
        f"{args.concurrency} in flight, {args.traces} traces ({13 * args.traces} spans) a request"
    )
    port = free_port()
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    modes = {  # name: (how, requests in flight, traces a request)
        "forwarder": ("forwarder", args.concurrency, args.traces),
        "calls": ("calls", args.concurrency, args.traces),
        "calls-large": ("calls", 8, 10 * args.traces),
    }
    with server([str(HERE / "forwarder_clients.py"), "sink", str(port)], "ready", "stdout", cores.harness):
        target = f"127.0.0.1:{port}"
        for mode, (how, concurrency, traces) in modes.items():
            for round_ in range(args.rounds):
                order = arms if round_ % 2 == 0 else arms[::-1]
                for client in order:
                    command = ["arm", client, target, how, str(args.seconds), str(concurrency), str(traces)]
                    result = _arm(command, cores.arm)
                    results.setdefault((mode, client), []).append(result)
                line = "  ".join(
                    f"{client} {results[mode, client][-1]['spans_per_s']:9.0f} spans/s "
                    f"{results[mode, client][-1]['cpu_us_per_span']:6.2f} µs CPU/span "
                    f"(busy {results[mode, client][-1]['busy']:.2f})"
                    for client in arms
                )
                print(f"{mode:11} round {round_ + 1}: {line}", flush=True)
    print("\nmedians of the per-round ratios to grpcio (and their range):")
    for mode, other, figure in itertools.product(modes, arms[1:], ("spans_per_s", "cpu_us_per_span")):
        paired = zip(results[mode, "grpcio"], results[mode, other], strict=True)
        ratios = [theirs[figure] / grpcio[figure] for grpcio, theirs in paired]
        medians = {client: statistics.median(r[figure] for r in results[mode, client]) for client in arms}
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
        print(
            f"  {mode:11} {other:6} {figure:16} {statistics.median(ratios):.2f} ({spread}); "
            f"medians grpcio {medians['grpcio']:.2f}, {other} {medians[other]:.2f}"
        )
    if not args.skip_held:
        port = free_port()
        with server(
            [str(HERE / "forwarder_clients.py"), "stall", str(port)], "ready", "stdout", cores.harness
        ):
            print("\nheld a request in flight (32 of 1 MiB, a downstream that reads nothing):")
            for client in arms:
                held = [
                    _arm(["held", client, f"127.0.0.1:{port}"], cores.arm)["held_per_request"]
                    for _ in range(3)
                ]
                print(
                    f"  {client:7} {statistics.median(held) / 2**20:.2f} MiB a request "
                    f"(runs: {', '.join(f'{h / 2**20:.2f}' for h in held)})"
                )
    if args.sizes:
        base, feature = (_stripped(path) for path in args.sizes)
        print(
            f"\nextension, stripped: {base / 1e6:.2f} MB without the client, {feature / 1e6:.2f} MB with it "
            f"(+{100 * (feature / base - 1):.1f}%)"
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "arm":
        client, target, how, seconds, concurrency, traces = sys.argv[2:8]
        print(
            json.dumps(
                asyncio.run(_drive(client, target, how, float(seconds), int(concurrency), int(traces)))
            )
        )
    elif len(sys.argv) > 1 and sys.argv[1] == "held":
        print(json.dumps(asyncio.run(_held(sys.argv[2], sys.argv[3], 32, 1 << 20))))
    elif len(sys.argv) > 1 and sys.argv[1] == "sink":
        sink(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "stall":
        stall(int(sys.argv[2]))
    else:
        sys.exit(main())
