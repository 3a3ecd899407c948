"""Concierge, pricing and fx: three agents of three runtimes, each a FastAPI service of its own.

``concierge.py`` hosts a pydantic-ai agent, ``pricing.py`` an OpenAI Agents SDK agent, ``fx.py`` a
LangGraph agent, each behind ``GuardMiddleware(agent=...)`` and each calling the next through one
tool over HTTP (httpx, httpx, requests): concierge → pricing → fx. Each model is scripted, as in the
other examples: no keys, no network beyond 127.0.0.1.

This program starts the three on 127.0.0.1 (``python -m uvicorn <service>:app``), asks the concierge
twice, prints what happened, and stops them:

1. a healthy request: concierge → pricing → fx, and fx answers on its own (2 tool calls);
2. a loop: the question asks fx to check with the concierge, so fx calls the concierge back, and
   the concierge calls pricing again, and so on. Each service's script gives up after its third tool
   call, so that the program ends even when nothing stops the loop.

Each service is a process of its own, as it would be deployed: a child of this one, with its own
``OTEL_SERVICE_NAME``. Run under ``opentelemetry-instrument``, the children inherit it (it works
through the environment they are given), so every service is instrumented with no change to its code
but the middleware line::

    pip install '.[services,asgi,pydantic-ai,openai-agents,langgraph]'
    OTEL_TRACES_EXPORTER=console OTEL_METRICS_EXPORTER=none OTEL_LOGS_EXPORTER=none \\
        opentelemetry-instrument python examples/services/app.py

The chain leaves each service with its calls, and fx's call back into the concierge is refused there
(``409``): fx's ``requests`` call raises the refusal, LangGraph hands it to fx's model as its tool's
error, fx answers with what it has, and the user gets a 200 with an answer (3 tool calls). Run plainly
(``python examples/services/app.py``), nothing carries the chain from one service to the next, and
the loop goes on until the scripts give up (6 tool calls). The spans of each service are printed
when it stops. The health checks (``GET /health``, where this program reads each service's count of
tool calls) are no hops: ``OTEL_GUARD_EXCLUDED_URLS=^/health$``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

SERVICES = ("concierge", "pricing", "fx")  # each calls the next; fx calls the concierge when asked to
HERE = Path(__file__).resolve().parent
HEALTHY = "Plan a 3-day offsite in Lisbon for 12 people, priced in USD"
LOOP = "Plan a 3-day offsite in Lisbon for 12 people, priced in USD; fx, check the dates with the concierge"
START_SECONDS = 60.0
ASK_SECONDS = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(urls: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """Start each service as ``python -m uvicorn <service>:app`` on its port, with the URL it calls."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",  # each service's lines as they happen, between this program's
        "CONCIERGE_URL": urls["concierge"],
        "PRICING_URL": urls["pricing"],
        "FX_URL": urls["fx"],
    }
    # Health checks are no hops for the guard (a regular expression searched in the path) and no
    # spans for OpenTelemetry's instrumentations (searched in the whole URL).
    env.setdefault("OTEL_GUARD_EXCLUDED_URLS", "^/health$")
    env.setdefault("OTEL_PYTHON_EXCLUDED_URLS", "/health$")
    services = []
    for name, url in urls.items():
        port = url.rsplit(":", 1)[1]
        command = [sys.executable, "-m", "uvicorn", f"{name}:app", "--app-dir", str(HERE)]
        command += ["--host", "127.0.0.1", "--port", port, "--log-level", "warning"]
        services.append(subprocess.Popen(command, env={**env, "OTEL_SERVICE_NAME": name}))
    return services


def wait_until_up(urls: dict[str, str], services: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + START_SECONDS
    for (name, url), service in zip(urls.items(), services, strict=True):
        while True:
            if service.poll() is not None:
                raise SystemExit(f"the {name} service exited with status {service.returncode}")
            try:
                health(url)
                break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the {name} service did not start within {START_SECONDS:.0f} s")
            time.sleep(0.1)


def health(url: str) -> dict[str, object]:
    """A service's ``GET /health``, with urllib: this program's own requests that are not spans
    (OpenTelemetry instruments httpx, not urllib, in this example's environment)."""
    with urllib.request.urlopen(f"{url}/health", timeout=10.0) as reply:
        answer: dict[str, object] = json.load(reply)
        return answer


def tool_calls(urls: dict[str, str]) -> int:
    """The tool calls the services have made so far, in all (each counts its own)."""
    return sum(int(str(health(url)["tool_calls"])) for url in urls.values())


def ask(urls: dict[str, str], label: str, question: str) -> tuple[str, int]:
    """Ask the concierge; its answer, and the tool calls the services made to answer it."""
    print(f"\n{label}: {question!r}", flush=True)
    before = tool_calls(urls)
    reply = httpx.post(f"{urls['concierge']}/ask", json={"question": question}, timeout=ASK_SECONDS)
    made = tool_calls(urls) - before
    answer = str(reply.json()["answer"] if reply.status_code == 200 else reply.text)
    print(f"the concierge answers HTTP {reply.status_code} ({made} tool calls): {answer!r}", flush=True)
    return answer, made


def stop(services: list[subprocess.Popen[bytes]]) -> None:
    """Stop each service with SIGINT (Ctrl+C), one after the other, so that their spans come out one
    service at a time: uvicorn then exits normally, and the SDK exports the spans it holds. (After a
    SIGTERM, uvicorn raises it again once shut down, and the process dies before the SDK's exit
    handler runs.)"""
    for service in services:
        service.send_signal(signal.SIGINT)
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()


def main() -> None:
    urls = {name: f"http://127.0.0.1:{free_port()}" for name in SERVICES}
    services = start(urls)
    try:
        wait_until_up(urls, services)
        ask(urls, "a healthy request", HEALTHY)
        answer, made = ask(urls, "a loop", LOOP)
    finally:
        stop(services)
    print(f"\nthe concierge's answer to the loop: {answer!r} after {made} tool calls")


if __name__ == "__main__":
    main()
