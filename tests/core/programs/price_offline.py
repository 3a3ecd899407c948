"""Price model responses with every network connection refused: genai-prices' bundled table only.

An audit hook (PEP 578) refuses every ``socket.connect`` and ``socket.getaddrinfo`` of the process
from its first line, before otel-guard or genai-prices is imported, so a fetch of newer prices (or
any other egress) would fail loudly instead of going out. Reads on stdin::

    {"responses": [[model, input_tokens, output_tokens], ...]}

and, in one guarded hop with ``max_cost`` on, adds each response to the tree; prints on stdout::

    {"spent": <the tree's spend, micro-units>, "blocked": <connections the hook refused>,
     "control": <the error a test connection to 127.0.0.1 met>}
"""

from __future__ import annotations

import sys

blocked: list[str] = []


def _no_egress(event: str, args: tuple[object, ...]) -> None:
    if event in ("socket.connect", "socket.getaddrinfo"):
        blocked.append(f"{event} {args[1:]!r}")
        raise OSError(f"no egress in this test: {event}")


sys.addaudithook(_no_egress)

import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import otel_guard  # noqa: E402
from otel_guard.budget import store_for  # noqa: E402
from otel_guard.usage import ModelUsage, after_model_request  # noqa: E402


def main() -> None:
    request = json.load(sys.stdin)
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1).close()
        control = "connected"
    except OSError as exc:
        control = str(exc)
    blocked.clear()  # the control's own
    settings = otel_guard.configure(max_cost="100")
    with otel_guard.delegate("planner") as hop:
        assert hop.chain is not None
        for model, input_tokens, output_tokens in request["responses"]:
            after_model_request(ModelUsage(model, input_tokens, output_tokens))
        key = f"tree:{settings.workspace}:{hop.chain.root}:cost"
        spent = store_for(settings).used(key, time.time())  # type: ignore[attr-defined]
    json.dump({"spent": spent, "blocked": blocked, "control": control}, sys.stdout)


if __name__ == "__main__":
    main()
