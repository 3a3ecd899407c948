"""A service in a pipeline, in a process of its own: the agent AGENT behind GuardMiddleware.

Usage: ``rollout_service.py PORT AGENT [NEXT_URL]``. Configured only by the environment
(``OTEL_GUARD_KEYS``, ``OTEL_GUARD_ACCEPT_UNSIGNED``, ...), as a deployed service is. Serves on
127.0.0.1:PORT (writes ``READY`` on stdout once it listens). ``POST /`` answers, from inside the
request's hop, what the guard decided for it and the chain it runs in, and, with a NEXT_URL, calls the
next service (its chain in the request's W3C headers) and adds that service's status and answer::

    {"agent": "budget", "decision": "would_refuse", "reason": "bad_signature",
     "events": ["otel_guard.would_refuse"], "chain": ["planner", "budget"], "root": "...",
     "next": {"status": 200, "body": {...}}}
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import httpx
import uvicorn
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import otel_guard
from otel_guard.asgi import GuardMiddleware

NEXT_URL = sys.argv[3] if len(sys.argv) > 3 else None


async def serve(request: Request) -> JSONResponse:
    span: Any = trace.get_current_span()  # the request's hop (an SDK span: its attributes readable)
    attributes = dict(span.attributes or {})
    chain = otel_guard.current_chain()
    answer: dict[str, Any] = {
        "agent": attributes.get("gen_ai.agent.name"),
        "decision": attributes.get("otel_guard.decision"),
        "reason": attributes.get("otel_guard.reason"),
        "events": [event.name for event in span.events],
        "chain": list(chain.agents) if chain is not None else None,
        "root": chain.root if chain is not None else None,
    }
    if NEXT_URL is not None:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        async with httpx.AsyncClient(timeout=20) as client:
            reply = await client.post(NEXT_URL, headers=headers)
        answer["next"] = {"status": reply.status_code, "body": reply.json()}
    return JSONResponse(answer)


def main() -> None:
    trace.set_tracer_provider(TracerProvider())
    app = GuardMiddleware(Starlette(routes=[Route("/", serve, methods=["POST"])]), agent=sys.argv[2])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sys.exit("uvicorn did not start")
        time.sleep(0.02)
    print("READY", flush=True)
    thread.join()  # until SIGTERM: uvicorn's own handler ends the server


if __name__ == "__main__":
    main()
