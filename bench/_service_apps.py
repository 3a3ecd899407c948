"""The service of ``bench/service_overhead.py``: a FastAPI app whose endpoint calls another service.

``front(call, agent)`` is the service measured: ``POST /quote`` reads a JSON question, asks the
downstream service ``fx`` for a rate through ``call`` (an httpx, requests or aiohttp call) and answers
JSON. ``agent`` wraps that work as the agent's run (``@agentic`` in the guarded arm) or is ``None``.

The downstream service is :data:`downstream`: a bare ASGI app answering a fixed body, so that what
it costs (and in the socket rows, its whole process) is the same small sum in both arms and never the
measured service's. It keeps the ``baggage`` header of the last call to ``/rate``, and answers it
at ``/last``, so a child can check after its warm-up that the chain left (and with which agents).

What a reader would not guess: the requests client's transport is an adapter that answers in this
process (requests has no in-process transport of its own); both instrumentations patch
``Session.send`` above it, so every instruction they add is counted, and only urllib3 is left out.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

RATE_BODY = b'{"rate":1.1}'
LAST_BAGGAGE: list[str] = [""]  # the in-process downstream's last /rate baggage header

Scope = MutableMapping[str, Any]
Call = Callable[[str], Awaitable[float]]


async def downstream(scope: Scope, receive: Callable[[], Awaitable[Any]], send: Any) -> None:
    """The service ``fx``: ``/rate`` answers :data:`RATE_BODY`, ``/last`` the baggage ``/rate`` got last."""
    if scope["type"] != "http":
        return
    message = await receive()
    while message.get("more_body"):
        message = await receive()
    if scope["path"] == "/last":
        body = LAST_BAGGAGE[0].encode("latin-1")
    else:
        baggage = [value for name, value in scope["headers"] if name == b"baggage"]
        LAST_BAGGAGE[0] = b",".join(baggage).decode("latin-1")
        body = RATE_BODY
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Ask(BaseModel):
    question: str


def front(call: Call, agent: Callable[[Call, str], Awaitable[float]] | None) -> FastAPI:
    """The service measured, as a FastAPI app (no middleware: the arms add theirs)."""
    app = FastAPI()

    @app.post("/quote")
    async def quote(body: Ask) -> dict[str, object]:
        rate = await (agent(call, body.question) if agent is not None else call(body.question))
        return {"question": body.question, "rate": rate}

    return app


# -- the clients: each a call of fx's /rate, made the usual way for its library -------------------


def httpx_call(client: Any) -> Call:
    async def call(question: str) -> float:
        response = await client.post("/rate", json={"question": question})
        response.raise_for_status()
        return float(response.json()["rate"])

    return call


def requests_call(session: Any, base: str) -> Call:
    async def call(question: str) -> float:
        response = session.post(f"{base}/rate", json={"question": question}, timeout=30)
        response.raise_for_status()
        return float(response.json()["rate"])

    return call


def aiohttp_call(session: Any, base: str) -> Call:
    async def call(question: str) -> float:
        async with session.post(f"{base}/rate", json={"question": question}) as response:
            response.raise_for_status()
            return float((await response.json())["rate"])

    return call


def in_process_adapter() -> Any:
    """A requests transport adapter that answers every request as :func:`downstream` would."""
    import requests
    from requests.adapters import BaseAdapter
    from requests.structures import CaseInsensitiveDict

    class InProcess(BaseAdapter):
        def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
            response = requests.Response()
            if request.path_url == "/last":
                body = LAST_BAGGAGE[0].encode("latin-1")
            else:
                baggage = request.headers.get("baggage", "")
                LAST_BAGGAGE[0] = baggage.decode("latin-1") if isinstance(baggage, bytes) else baggage
                body = RATE_BODY
            response.status_code = 200
            response.headers = CaseInsensitiveDict(
                {"content-type": "application/json", "content-length": str(len(body))}
            )
            response._content = body
            response.url = request.url or ""
            response.request = request
            response.reason = "OK"
            response.encoding = "utf-8"
            return response

        def close(self) -> None:
            pass

    return InProcess()


def serve_downstream(port: int) -> None:
    """Serve :func:`downstream` on 127.0.0.1:``port`` until killed (the socket rows' other process)."""
    import uvicorn

    # Keep-alive far past a child's run: a connection closed between requests would be made again.
    uvicorn.run(
        downstream, host="127.0.0.1", port=port, log_level="critical", lifespan="off", timeout_keep_alive=3600
    )


def quote_body(i: int) -> bytes:
    return json.dumps({"question": f"EUR to USD, request {i}"}).encode()


if __name__ == "__main__":
    serve_downstream(int(sys.argv[1]))
