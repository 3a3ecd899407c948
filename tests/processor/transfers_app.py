"""Handoffs and calls through the inline guard, exporting its spans over OTLP/gRPC.

Run by tests/processor/test_transfer_spans.py as ``python transfers_app.py HOST:PORT``: the spans go to
the processor under test, each scenario in a trace of its own. The guard runs in enforce mode; each
refusal is printed as one JSON line (reason, agent, the refused chain's path), so the test can
compare what the guard allowed and refused with what the processor counts from the spans alone.
"""

from __future__ import annotations

import json
import sys

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import otel_guard
from otel_guard import DelegationRefused, delegate

REFUSED: list[dict[str, str]] = []


def chain(hops: list[tuple[str, bool]]) -> None:
    """Each hop inside the one before it (``(agent, transfer)``), as a runtime's handoffs nest."""
    agent, transfer = hops[0]
    try:
        with delegate(agent, transfer=transfer):
            if hops[1:]:
                chain(hops[1:])
    except DelegationRefused as error:
        if error.hop.agent == agent:  # refused here, not below
            path = error.chain.path() if error.chain is not None else ""
            REFUSED.append({"reason": error.reason, "agent": agent, "chain": path})
        else:
            raise


def main(endpoint: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "handoffs"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    trace.set_tracer_provider(provider)
    otel_guard.configure(mode="enforce", cycle_rule="agent")
    # triage ⇒ faq ⇒ triage by handoffs (the OpenAI Agents SDK's customer-service shape): allowed.
    chain([("triage", False), ("faq", True), ("triage", True)])
    # The same shape by calls: triage still waits for faq, and is refused.
    chain([("triage", False), ("faq", False), ("triage", False)])
    # An agent whose name holds `>`, calling itself; a name with a backslash in a loop of two.
    chain([("planner>budget", False), ("planner>budget", False)])
    chain([("fx\\eu", False), ("rates", False), ("fx\\eu", False)])
    provider.shutdown()  # flushes every span to the processor
    for line in REFUSED:
        print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1])
