"""What the guard adds to a request between services, in instructions, against OpenTelemetry's own.

One service is measured: a FastAPI app (``bench/_service_apps.py``) whose ``POST /quote`` calls the
downstream service ``fx`` once and answers JSON. Each request is driven straight into the app's ASGI
callable (scope, receive, send: no server, so no event-loop ticks of one are counted), with a fresh
``traceparent``, as if a caller's instrumented client had sent it. Two arms, each under the SDK's
TracerProvider (BatchSpanProcessor, discarding exporter) and MeterProvider, with the propagators
``tracecontext,baggage``:

* ``bare``: OpenTelemetry's own instrumentation only: ``OpenTelemetryMiddleware``
  (opentelemetry-instrumentation-asgi, its defaults: a SERVER span and its ``http send`` /
  ``http receive`` spans, the server metrics) around the app, and the client's own instrumentor
  (opentelemetry-instrumentation-httpx, -requests or -aiohttp-client);
* ``guarded``: the same, plus ``GuardMiddleware(agent="concierge")`` in the app and the
  ``otel_guard_http`` instrumentor (``HTTPClientsInstrumentor``) on the client, keys configured (the
  outgoing chain is signed).

The rows (a request of each, the arms side by side):

* ``first``: no chain arrives: the service is the chain's first hop (httpx, in process);
* ``chain``: the caller's chain arrives in ``baggage``, a fresh token signed with the workspace's
  key for every request, so the guard verifies it every time, as a service pays it (httpx);
* ``agent``: as ``chain``, and the endpoint's work is the agent ``concierge``'s run (``@agentic``
  in the guarded arm, the same function undecorated in the bare one), which joins the request's hop;
* ``requests``: as ``chain`` with requests (an in-process transport adapter, below ``Session.send``);
* ``aiohttp``, ``httpx-tcp``: as ``chain`` over real sockets to ``fx`` on 127.0.0.1, served by another
  process (not counted): aiohttp has no in-process transport, and ``httpx-tcp`` shows the share of
  the transport a user pays, against the in-process ``chain`` row.

Transports: httpx goes through ``httpx.ASGITransport`` to an ``fx`` in this process (a bare ASGI app
answering a fixed body), so every instruction counted is the service's own, the client's protocol
work left out: the ratio is the strictest one. Over a socket the service also pays its client's I/O,
in both arms, and the ratio falls.

Each arm runs in a child process under callgrind twice, with 0 and with ``--count`` requests after the
same setup and warm-up (20 requests); the difference over the count is one request, garbage
collection and the span processor's thread included (``bench/_callgrind.py``: a fixed hash seed; the
processor woken by a full batch or a flush, never its timer; the collector off during the counted
requests and collecting once after them; the SDK's ids and ``uuid4`` seeded). A child checks what it
measured: every answer 200 with the rate, the chain ``fx`` received (the caller's, extended by
``concierge`` in the guarded arm), and it prints the guard's spans a request (0 bare, 1 guarded: the
agent's run joined the hop).

Environment: OpenTelemetry's ASGI and client instrumentations, which the main ``.venv`` leaves out on
purpose (``opentelemetry-instrument`` would load them under every test). ``scripts/bootstrap`` makes
``.venv-examples/services`` with them (``pip install -e '.[services,asgi]'`` in any venv does too);
the ``aiohttp`` row also needs aiohttp itself (``pip install aiohttp`` there; skipped without it);
valgrind (Debian: ``apt-get install valgrind``).

What a reader would not guess: two identical children agree within 12 k instructions a request, but
the process's memory layout moves a count more: with one more environment variable of 37 characters,
the bare ``chain`` arm counted 150 k more a request over 20 requests, 25 k more over 40 (its ratio
1.098 against 1.103). Read a ratio to about ±0.01.

Usage: .venv-examples/services/bin/python bench/service_overhead.py [--count 100] [--row NAME ...] [--jobs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOAL = 1.1  # issue 40: a guarded request at most 1.1 times the same request under OpenTelemetry's own
WARMUP = 20
SECRET = b"s" * 32
AGENT, SKILL, CALLER = "concierge", "quote", ("planner", "plan")
ARMS = ("bare", "guarded")


@dataclass(frozen=True)
class Row:
    name: str
    client: str  # httpx, requests or aiohttp
    tcp: bool  # fx in another process on 127.0.0.1, else in this one
    chain: bool  # the caller's chain arrives (verified)
    agent: bool  # the endpoint's work is the agent's run, which joins the request's hop
    label: str


ROWS = {
    row.name: row
    for row in (
        Row("first", "httpx", False, False, False, "httpx, in process; no chain arrives (first hop)"),
        Row("chain", "httpx", False, True, False, "httpx, in process; a signed chain arrives, verified"),
        Row("agent", "httpx", False, True, True, "as `chain`, the agent's run joining the hop"),
        Row("requests", "requests", False, True, False, "requests, in process; a chain arrives"),
        Row("aiohttp", "aiohttp", True, True, False, "aiohttp, 127.0.0.1; a chain arrives"),
        Row("httpx-tcp", "httpx", True, True, False, "httpx, 127.0.0.1; a chain arrives"),
    )
}


# -- the child: one arm, ``count`` requests -----------------------------------------------------


def setup_sdk() -> tuple[Any, Any]:
    """The SDK of both arms (global, as OpenTelemetry's instrumentations use it), and an exporter that
    discards the spans and counts the guard's."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import otel_guard
    from otel_guard import telemetry

    class CountGuardSpans(SpanExporter):
        guard_spans = 0

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            scope = telemetry.INSTRUMENTATION_NAME
            self.guard_spans += sum(1 for s in spans if s.instrumentation_scope.name == scope)
            return SpanExportResult.SUCCESS

    exporter = CountGuardSpans()
    provider = TracerProvider()
    # Woken by a full batch or a flush only, never by its 5 s timer (whose count would follow how
    # slowly callgrind runs).
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536, schedule_delay_millis=1e9))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(meter_provider)
    telemetry.bind(provider, meter_provider)
    otel_guard.configure(mode="enforce", keys={"bench": SECRET})
    return provider, exporter


def incoming_tokens(n: int) -> list[str]:
    """``n`` chains ``planner`` -> (this service), each a fresh root, signed with the workspace's key by
    a keyring of their own: the guard's cache of tokens it signed or verified knows none of them."""
    from otel_guard.chain import Chain, ChainToken, Hop, Keyring, new_root

    caller = Keyring({"bench": SECRET})
    now = time.time()
    return [
        str(ChainToken(Chain((Hop(*CALLER),), new_root(), "default", now, now + 300), caller))
        for _ in range(n)
    ]


def request_headers(n: int, chain: bool) -> list[list[tuple[bytes, bytes]]]:
    import random

    tokens = incoming_tokens(n) if chain else []
    requests = []
    for i in range(n):
        headers = [
            (b"host", b"concierge.internal"),
            (b"user-agent", b"caller/1.0"),
            (b"content-type", b"application/json"),
            (b"traceparent", f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-01".encode()),
        ]
        if chain:
            headers.append((b"baggage", f"otel_guard.chain={tokens[i]}".encode()))
        requests.append(headers)
    return requests


async def one_request(app: Any, headers: list[tuple[bytes, bytes]], i: int) -> tuple[int, bytes]:
    """One ``POST /quote`` into ``app``'s ASGI callable: its status and body."""
    from _service_apps import quote_body

    body = quote_body(i)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/quote",
        "raw_path": b"/quote",
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000 + i % 10000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if received:
            await asyncio.Event().wait()  # a disconnect never comes: the app has its body
        received = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def instrument_client(row: Row, guarded: bool) -> None:
    if row.client == "httpx":
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

        HTTPXClientInstrumentor().instrument()
    elif row.client == "requests":
        from opentelemetry.instrumentation.requests import RequestsInstrumentor

        RequestsInstrumentor().instrument()
    else:
        from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor

        AioHttpClientInstrumentor().instrument()
    if guarded:
        from otel_guard.instrumentation.http import HTTPClientsInstrumentor

        HTTPClientsInstrumentor().instrument()


async def open_client(row: Row, downstream: str) -> tuple[Any, Callable[[], Any]]:
    """The client's call of fx's ``/rate`` and what closes the client (made after instrumenting)."""
    import _service_apps as apps

    if row.client == "httpx":
        import httpx

        if row.tcp:
            client = httpx.AsyncClient(base_url=downstream)
        else:
            client = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=apps.downstream), base_url="http://fx"
            )
            # The instrumentor patches the HTTP transports; an ASGITransport is instrumented per client.
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

            HTTPXClientInstrumentor.instrument_client(client)
        return apps.httpx_call(client), client.aclose
    if row.client == "requests":
        import requests

        session = requests.Session()
        session.mount("http://fx", apps.in_process_adapter())

        async def close_session() -> None:
            session.close()

        return apps.requests_call(session, "http://fx"), close_session
    import aiohttp

    http = aiohttp.ClientSession()
    return apps.aiohttp_call(http, downstream), http.close


async def last_chain(row: Row, downstream: str) -> tuple[str, ...]:
    """The agents of the chain fx received last (``()`` for none), read outside the counted requests."""
    import _service_apps as apps

    from otel_guard.chain import Keyring, decode

    if row.tcp:
        import httpx

        async with httpx.AsyncClient() as plain:
            baggage = (await plain.get(f"{downstream}/last")).text
    else:
        baggage = apps.LAST_BAGGAGE[0]
    for member in baggage.split(","):
        key, _, value = member.strip().partition("=")
        if key == "otel_guard.chain":
            return decode(value, Keyring({"bench": SECRET})).agents
    return ()


def build_app(row: Row, guarded: bool, call: Any) -> Any:
    import _service_apps as apps
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    agent = None
    if row.agent:

        async def concierge(call: apps.Call, question: str) -> float:
            return await call(question)

        if guarded:
            import otel_guard

            agent = otel_guard.agentic(name=AGENT)(concierge)
        else:
            agent = concierge
    app = apps.front(call, agent)
    if guarded:
        from otel_guard.asgi import GuardMiddleware

        app.add_middleware(GuardMiddleware, agent=AGENT, skill=SKILL)
    return OpenTelemetryMiddleware(app)


def _seed_ids() -> None:
    """Every random id the same from child to child (the SDK's ids, roots, ``uuid4``), as in
    ``bench/runtime_overhead.py``."""
    import random
    import uuid

    random.seed(0)
    uuid.uuid4 = lambda: uuid.UUID(int=random.getrandbits(128), version=4)


def child(row: Row, arm: str, count: int, setup_count: int, downstream: str) -> None:
    """``count`` requests of one arm after a setup and a warm-up that do not depend on it (its
    requests' headers made for ``setup_count``, the pair's count); prints the guard's spans a request."""
    sys.path.insert(0, str(HERE))
    _seed_ids()
    guarded = arm == "guarded"
    provider, exporter = setup_sdk()
    instrument_client(row, guarded)
    headers = request_headers(WARMUP + setup_count, row.chain)

    async def run() -> None:
        call, close = await open_client(row, downstream)
        app = build_app(row, guarded, call)
        for i in range(WARMUP):
            status, body = await one_request(app, headers[i], i)
            if status != 200 or b'"rate":1.1' not in body:
                raise SystemExit(f"{row.name}/{arm}: the service answered {status} {body[:300]!r}")
        got = await last_chain(row, downstream)
        wanted = (CALLER[0],) * row.chain + (AGENT,) * guarded
        if got != wanted:
            raise SystemExit(f"{row.name}/{arm}: fx received the chain {got}, not {wanted}")
        provider.force_flush()
        before = exporter.guard_spans
        gc.collect()
        gc.disable()  # the garbage of the counted requests is collected once, below, and counted
        for i in range(WARMUP, WARMUP + count):
            status, _ = await one_request(app, headers[i], i)
            if status != 200:
                raise SystemExit(f"{row.name}/{arm}: the service answered {status}")
        gc.collect()
        gc.enable()
        provider.force_flush()
        print(f"{(exporter.guard_spans - before) / max(count, 1):g}")
        await close()

    asyncio.run(run())
    provider.shutdown()


# -- the parent ---------------------------------------------------------------------------------


def per_request(row: Row, arm: str, count: int, downstream: str) -> tuple[float, float]:
    """Instructions a request of ``arm`` (``count`` requests less none) and the guard's spans a request."""
    import _callgrind as callgrind

    def run(n: int) -> tuple[int, str]:
        arguments = ["--child", row.name, "--arm", arm, "--count", str(n), "--setup-count", str(count)]
        return callgrind.counted(__file__, [*arguments, "--downstream", downstream], 3600, CHILD_ENV)

    with ThreadPoolExecutor(2) as pool:  # the pair shares nothing but the machine: counts don't mind
        base_future, total_future = pool.submit(run, 0), pool.submit(run, count)
        (base, _), (total, printed) = base_future.result(), total_future.result()
    return (total - base) / count, float(printed.split()[-1])


ASGI_INSTRUMENTATION = "opentelemetry.instrumentation.asgi"
CLIENT_MODULES = {
    "httpx": ("httpx", "opentelemetry.instrumentation.httpx"),
    "requests": ("requests", "opentelemetry.instrumentation.requests"),
    "aiohttp": ("aiohttp", "opentelemetry.instrumentation.aiohttp_client"),
}
"""What each client's rows import (the services extra installs the instrumentations, not aiohttp)."""

CHILD_ENV = {**os.environ, "OTEL_PROPAGATORS": "tracecontext,baggage"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_downstream() -> tuple[subprocess.Popen[bytes], str]:
    """fx on 127.0.0.1 in a process of its own (uncounted), for the socket rows; waits until it answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(HERE / "_service_apps.py"), str(port)])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"http://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None:
                raise SystemExit("the downstream service exited at start") from None
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the downstream service did not start on 127.0.0.1 within 20 s")


def measured(row: Row, arm: str, count: int) -> tuple[float, float]:
    """:func:`per_request` of one arm; a socket row gets an ``fx`` of its own, so that arms counted at
    once (``--jobs``) never read each other's chain from ``/last``."""
    if not row.tcp:
        return per_request(row, arm, count, "")
    server, downstream = start_downstream()
    try:
        return per_request(row, arm, count, downstream)
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=100, help="requests an arm (default 100)")
    parser.add_argument("--row", action="append", choices=sorted(ROWS), help="default: every row")
    parser.add_argument("--jobs", type=int, default=1, help="arms counted at once (each runs 2 children)")
    parser.add_argument("--child", choices=sorted(ROWS), help=argparse.SUPPRESS)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--setup-count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--downstream", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(ROWS[args.child], args.arm, args.count, args.setup_count, args.downstream)
        return
    if args.count < 1 or args.jobs < 1:
        parser.error("--count and --jobs must be >= 1")
    sys.path.insert(0, str(HERE))
    import _callgrind as callgrind

    callgrind.require_valgrind()
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec(ASGI_INSTRUMENTATION) is None:
        raise SystemExit(
            "OpenTelemetry's ASGI instrumentation or FastAPI is missing here: run this with "
            ".venv-examples/services/bin/python (scripts/bootstrap makes it)"
        )
    rows = []
    for name in args.row or ROWS:
        missing = [
            module for module in CLIENT_MODULES[ROWS[name].client] if importlib.util.find_spec(module) is None
        ]
        if missing:
            print(f"{name}: skipped, {' and '.join(missing)} not installed in this environment")
        else:
            rows.append(ROWS[name])
    print(
        f"Python {sys.version.split()[0]}; {args.count} requests an arm; instructions a request (callgrind)"
    )
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {
            (row.name, arm): pool.submit(measured, row, arm, args.count) for row in rows for arm in ARMS
        }
        for row in rows:
            (bare, bare_spans), (guarded, spans) = (futures[(row.name, arm)].result() for arm in ARMS)
            ratio = guarded / bare
            print(
                f"{row.name:10s} bare {bare / 1e3:7.0f} k   guarded {guarded / 1e3:7.0f} k   "
                f"added {(guarded - bare) / 1e3:6.0f} k   ratio {ratio:.3f} "
                f"(goal <= {GOAL}: {'met' if ratio <= GOAL else 'NOT met'})   "
                f"guard spans a request {bare_spans:g} / {spans:g}   [{row.label}]",
                flush=True,
            )


if __name__ == "__main__":
    main()
