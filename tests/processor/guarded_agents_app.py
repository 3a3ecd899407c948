"""A small agent system guarded inline by otel_guard, exporting its spans over OTLP/gRPC.

Run by tests/processor/test_inline_guard.py as ``python guarded_agents_app.py HOST:PORT``: the
spans go to the processor under test. Each scenario below is a loop the inline guard refuses
(enforce mode); each refusal is printed as one JSON line (reason and the refused chain's agents),
so the test can compare what the guard refused with what the processor finds in the spans alone.
"""

from __future__ import annotations

import json
import sys

from opentelemetry import baggage, context, propagate, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

import otel_guard
from otel_guard import DelegationRefused, agentic, delegate

REFUSED: list[dict[str, object]] = []


def refused(error: DelegationRefused) -> None:
    agents = [hop.agent for hop in error.chain.hops] if error.chain is not None else []
    REFUSED.append({"reason": error.reason, "agent": error.hop.agent, "chain": agents})


@agentic
def planner(task: str) -> str:
    with delegate("search", kind="tool"):
        pass
    return budget(task)


@agentic
def budget(task: str) -> str:
    try:
        return planner(task)  # the loop: budget asks the planner again
    except DelegationRefused as error:
        refused(error)
        return "over budget"


@agentic
def summarize(text: str, rounds: int) -> str:
    if rounds == 0:
        return text[:10]
    try:
        return summarize(text[: len(text) // 2], rounds - 1)  # a function that calls itself
    except DelegationRefused as error:
        refused(error)
        return text


def remote_call_without_loop() -> None:
    """A hop to another agent over a carrier, recorded on both sides: one call, no loop."""
    with delegate("travel"), delegate("weather", span_kind=SpanKind.CLIENT):
        headers: dict[str, str] = {}
        propagate.inject(headers)
        token = context.attach(propagate.extract(headers))
        try:
            with delegate("weather", receiving=True, span_kind=SpanKind.SERVER):
                pass
        finally:
            context.detach(token)


def loop_across_traces() -> None:
    """The chain goes on in a new trace (as through a queue that keeps baggage, not the trace)."""
    with delegate("planner"), delegate("budget"):
        chain_baggage = baggage.get_all()
    fresh = context.Context()
    for key, value in chain_baggage.items():
        fresh = baggage.set_baggage(key, value, fresh)
    token = context.attach(fresh)
    try:
        with delegate("planner"):
            pass
    except DelegationRefused as error:
        refused(error)
    finally:
        context.detach(token)


def main(endpoint: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "guarded-agents"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    trace.set_tracer_provider(provider)
    otel_guard.configure(mode="enforce", cycle_rule="agent")
    planner("plan a trip")
    summarize("a long text " * 20, 3)
    remote_call_without_loop()
    loop_across_traces()
    provider.shutdown()  # flushes every span to the processor
    for line in REFUSED:
        print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1])
