"""A process on the path of a delegation: extract the carrier, enter hops, inject for the next process.

Configured only by the environment (``OTEL_GUARD_*``), as a deployed agent would be. Reads on stdin::

    {"carrier": {...}, "hops": [{"agent": "budget", "skill": "price", "receiving": true}, ...]}

enters the hops one inside the other (the first with the extracted context), and prints on stdout::

    {"outcome": "ok" | "refused", "chain": {...} | null, "carrier": {...}, "refusal": {...} | null,
     "spans": [{"name", "trace_id", "decision", "reason", "kind"}, ...]}
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import otel_guard


def main() -> None:
    request = json.load(sys.stdin)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    result: dict[str, Any] = {"outcome": "ok", "chain": None, "carrier": {}, "refusal": None}
    token = context.attach(propagate.extract(request["carrier"]))
    try:
        with ExitStack() as hops:
            for hop in request["hops"]:
                receiving = bool(hop.get("receiving"))
                hops.enter_context(
                    otel_guard.delegate(
                        hop["agent"],
                        hop.get("skill"),
                        receiving=receiving,
                        span_kind=SpanKind.SERVER if receiving else SpanKind.INTERNAL,
                    )
                )
            chain = otel_guard.current_chain()
            assert chain is not None
            result["chain"] = {
                "root": chain.root,
                "workspace": chain.workspace,
                "hops": [[h.agent, h.skill] for h in chain.hops],
                "expires_at": chain.expires_at,
            }
            propagate.inject(result["carrier"])
    except otel_guard.DelegationRefused as refused:
        result["outcome"] = "refused"
        result["refusal"] = {
            "reason": refused.reason,
            "code": refused.code,
            "status": refused.status,
            "message": str(refused),
        }
    finally:
        context.detach(token)

    result["spans"] = [
        {
            "name": span.name,
            "trace_id": f"{span.context.trace_id:032x}",
            "decision": span.attributes.get("otel_guard.decision"),
            "reason": span.attributes.get("otel_guard.reason"),
            "kind": span.kind.name,
        }
        for span in exporter.get_finished_spans()
        if span.context is not None and span.attributes is not None
    ]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
