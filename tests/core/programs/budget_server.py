"""An HTTP agent in a delegation tree, in a process of its own: ``budget`` behind GuardMiddleware.

Configured only by the environment (``OTEL_GUARD_*``: the budget store among them). Serves on
127.0.0.1 at the port given as the first argument (writes ``READY`` on stdout once it listens).
``POST /spend?hops=N`` makes N hops in the request's hop, one after another (``fx0``, ``fx1``, ...),
and answers ``{"allowed": [the otel_guard.budget.hops each allowed one saw], "refused": [reasons]}``.
"""

from __future__ import annotations

import sys
import threading
import time

import uvicorn
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import otel_guard
from otel_guard.asgi import GuardMiddleware


async def spend(request: Request) -> JSONResponse:
    allowed: list[int] = []
    refused: list[str] = []
    for index in range(int(request.query_params["hops"])):
        try:
            async with otel_guard.delegate(f"fx{index}") as hop:
                allowed.append(int((hop.span.attributes or {})["otel_guard.budget.hops"]))  # type: ignore[attr-defined]
        except otel_guard.DelegationRefused as err:
            refused.append(err.reason)
    return JSONResponse({"allowed": allowed, "refused": refused})


def main() -> None:
    trace.set_tracer_provider(TracerProvider())
    app = GuardMiddleware(Starlette(routes=[Route("/spend", spend, methods=["POST"])]), agent="budget")
    config = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    server = uvicorn.Server(config)
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
