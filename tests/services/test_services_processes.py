"""Two services in two processes under ``opentelemetry-instrument``, with no code of ours but the middleware.

What the in-process tests (``test_services.py``) cannot show: a deployed service, started as
``opentelemetry-instrument python -m uvicorn ...`` with its own ``OTEL_SERVICE_NAME``, whose endpoint
calls the next service with a plain httpx client (``programs/relay_service.py``). Service ``a`` calls
service ``b``; each prints its spans on the console (stdout, a file per service) when it stops.

- In ``.venv-examples/services`` (the README's install for agents behind HTTP: OpenTelemetry's own
  ASGI, FastAPI and httpx instrumentations are there), the chain leaves ``a`` through httpx and ``b``'s
  spans continue ``a``'s trace: ``b``'s server span is the child of ``a``'s httpx client span.
- In this suite's own environment, which has no OpenTelemetry httpx instrumentation, the chain still
  travels (the guard's ``otel_guard_http`` adds its baggage member itself): ``b`` runs in chain
  ``a → b`` of the same root. The trace does not continue there: carrying it is OpenTelemetry's
  instrumentation's job, which is why the README installs the ``services`` extra.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ports import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"
SERVICES_BIN = ROOT / ".venv-examples" / "services" / "bin"
THIS_BIN = Path(sys.executable).parent  # this suite's environment (.venv)
START_SECONDS = 60.0
STOP_SECONDS = 30.0
CALL_SECONDS = 30.0
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
OTEL_HTTPX = "opentelemetry.instrumentation.httpx"


@dataclass
class Service:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    out: Path
    err: Path

    def spans(self) -> list[dict[str, Any]]:
        """The spans its console exporter printed (each a JSON object starting on a line ``{``)."""
        text, decoder, found, at = self.out.read_text(encoding="utf-8"), json.JSONDecoder(), [], 0
        while (start := text.find("{\n", at)) >= 0:
            span, at = decoder.raw_decode(text, start)
            found.append(span)
        return found


def has_module(bin_dir: Path, module: str) -> bool:
    found = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            f"import importlib.util; print(importlib.util.find_spec({module!r}))",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return found.stdout.strip() != "None"


def start(bin_dir: Path, name: str, tmp_path: Path, next_url: str | None = None) -> Service:
    """``name`` as a deployed service: ``opentelemetry-instrument python -m uvicorn`` from ``bin_dir``,
    configured only by its environment, listening on 127.0.0.1 once this returns."""
    port = free_port()
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONUNBUFFERED": "1",
        "OTEL_SERVICE_NAME": name,
        "AGENT": name,
        **CONSOLE,
        **({"NEXT_URL": next_url} if next_url else {}),
    }
    command = [str(bin_dir / "opentelemetry-instrument"), str(bin_dir / "python"), "-m", "uvicorn"]
    command += ["relay_service:app", "--app-dir", str(PROGRAMS), "--host", "127.0.0.1", "--port", str(port)]
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=stderr)
    service = Service(name, f"http://127.0.0.1:{port}", process, out, err)
    deadline = time.monotonic() + START_SECONDS
    while True:  # listening: a TCP connection, not a request (which would be a hop)
        assert process.poll() is None, f"{name} exited:\n{err.read_text(encoding='utf-8')[-3000:]}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return service
        except OSError:
            assert time.monotonic() < deadline, f"{name} did not start:\n{err.read_text(encoding='utf-8')}"
            time.sleep(0.1)


def stop(service: Service) -> None:
    """SIGINT, as Ctrl+C: uvicorn exits normally and the SDK exports the spans it holds."""
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGINT)
    try:
        service.process.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()
        raise AssertionError(f"{service.name} did not stop on SIGINT") from None


@contextmanager
def pipeline(bin_dir: Path, tmp_path: Path) -> Iterator[tuple[Service, Service]]:
    """Services ``a`` → ``b`` from ``bin_dir``; both stopped (their spans exported) when the block ends."""
    with ExitStack() as running:
        b = start(bin_dir, "b", tmp_path)
        running.callback(stop, b)
        a = start(bin_dir, "a", tmp_path, next_url=b.url)
        running.callback(stop, a)
        yield a, b


def ask(service: Service) -> dict[str, Any]:
    """``POST /ask`` from this process with urllib: no instrumentation of this process carries anything."""
    request = urllib.request.Request(f"{service.url}/ask", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=CALL_SECONDS) as reply:
        assert reply.status == 200
        answer: dict[str, Any] = json.load(reply)
        return answer


def only(spans: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [s for s in spans if s["kind"] == f"SpanKind.{kind}" and (name is None or s["name"] == name)]
    assert len(found) == 1, [(s["kind"], s["name"]) for s in spans]
    return found[0]


def no_traceback(*services: Service) -> None:
    for service in services:
        assert "Traceback" not in service.err.read_text(encoding="utf-8"), service.err.read_text(
            encoding="utf-8"
        )


def test_with_opentelemetry_http_instrumentations_the_chain_leaves_through_httpx_and_the_trace_continues(
    tmp_path: Path,
) -> None:
    if not (SERVICES_BIN / "python").exists():
        raise AssertionError(f"{SERVICES_BIN.parent} is missing: scripts/bootstrap makes it")
    assert has_module(SERVICES_BIN, OTEL_HTTPX), (
        "the services extra installs OpenTelemetry's httpx instrumentation"
    )

    with pipeline(SERVICES_BIN, tmp_path) as (a, b):
        answer = ask(a)

    # The chain left a through httpx: b ran as the next hop of a's chain, in the same tree.
    assert answer["chain"] == ["a"]
    assert answer["next"]["status"] == 200
    arrived = answer["next"]["body"]
    assert arrived["chain"] == ["a", "b"]
    assert arrived["root"] == answer["root"]
    assert arrived["traceparent"] is True
    assert "otel_guard.chain" in arrived["baggage"]
    # The trace continued: b's server span (OpenTelemetry's FastAPI instrumentation) is the child of a's
    # httpx client span (OpenTelemetry's httpx instrumentation), and every span of both is in one trace.
    a_spans, b_spans = a.spans(), b.spans()
    client, server = only(a_spans, "CLIENT"), only(b_spans, "SERVER")
    assert server["parent_id"] == client["context"]["span_id"]
    assert {s["context"]["trace_id"] for s in a_spans + b_spans} == {client["context"]["trace_id"]}
    hop_a, hop_b = only(a_spans, "INTERNAL", "invoke_agent a"), only(b_spans, "INTERNAL", "invoke_agent b")
    assert hop_b["attributes"]["otel_guard.chain.agents"] == ["a", "b"]
    assert hop_a["attributes"]["otel_guard.chain.root"] == hop_b["attributes"]["otel_guard.chain.root"]
    assert {s["resource"]["attributes"]["service.name"] for s in b_spans} == {"b"}
    no_traceback(a, b)


def test_without_opentelemetry_httpx_instrumentation_the_guard_still_carries_the_chain(
    tmp_path: Path,
) -> None:
    assert importlib.util.find_spec(OTEL_HTTPX) is None, (
        f"this case needs an environment without {OTEL_HTTPX}; {THIS_BIN.parent} has it now"
    )
    assert has_module(THIS_BIN, "otel_guard.instrumentation.http")

    with pipeline(THIS_BIN, tmp_path) as (a, b):
        answer = ask(a)

    # The guard's own baggage member, and nothing else: no traceparent, no other baggage.
    arrived = answer["next"]["body"]
    assert answer["next"]["status"] == 200
    assert arrived["chain"] == ["a", "b"]
    assert arrived["root"] == answer["root"]
    assert arrived["baggage"] == ["otel_guard.chain"]
    assert arrived["traceparent"] is False
    # One delegation tree in two traces: without OpenTelemetry's httpx instrumentation nothing carries the
    # trace (the services extra does), while the chain links the hops all the same.
    hop_a, hop_b = (
        only(a.spans(), "INTERNAL", "invoke_agent a"),
        only(b.spans(), "INTERNAL", "invoke_agent b"),
    )
    assert hop_b["attributes"]["otel_guard.chain.agents"] == ["a", "b"]
    assert hop_a["attributes"]["otel_guard.chain.root"] == hop_b["attributes"]["otel_guard.chain.root"]
    assert hop_a["context"]["trace_id"] != hop_b["context"]["trace_id"]
    no_traceback(a, b)
