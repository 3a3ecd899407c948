"""A service of a pipeline in a process of its own: a FastAPI app under ``GuardMiddleware``, and no other
otel-guard or OpenTelemetry code in its path.

Run as ``opentelemetry-instrument python -m uvicorn relay_service:app --app-dir tests/services/programs``,
named by ``AGENT``. ``POST /ask`` answers what arrived with the request (whether a ``traceparent`` came,
the names of its baggage members: never a token) and the chain in force in the endpoint; with
``NEXT_URL`` it first calls the next service's ``/ask`` with a plain ``httpx.AsyncClient`` (no
``propagate.inject``: whatever carries the chain and the trace is instrumentation) and adds that
service's status and answer as ``next``.
"""

from __future__ import annotations

import os

import httpx
from fastapi import FastAPI, Request

import otel_guard
from otel_guard.asgi import GuardMiddleware

CALL_SECONDS = 20.0

app = FastAPI()


@app.post("/ask")
async def ask(request: Request) -> dict[str, object]:
    chain = otel_guard.current_chain()
    members = request.headers.get("baggage", "").split(",")
    answer: dict[str, object] = {
        "agent": os.environ["AGENT"],
        "chain": None if chain is None else list(chain.agents),
        "root": None if chain is None else chain.root,
        "traceparent": "traceparent" in request.headers,
        "baggage": sorted(member.split("=", 1)[0].strip() for member in members if member.strip()),
    }
    next_url = os.environ.get("NEXT_URL")
    if next_url:
        async with httpx.AsyncClient(timeout=CALL_SECONDS) as client:
            reply = await client.post(f"{next_url}/ask")
        answer["next"] = {"status": reply.status_code, "body": reply.json()}
    return answer


app.add_middleware(GuardMiddleware, agent=os.environ["AGENT"])
