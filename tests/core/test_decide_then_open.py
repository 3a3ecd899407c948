"""A hop decided before its call begins, its span started once the call's own span exists.

``Delegation.decide()`` / ``open()`` are what the LangGraph instrumentor uses so that a hop's span goes
under the span a LangChain tracer makes when the call's run begins. The decision is the same as
``start()``'s; only the span waits.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context, trace

import otel_guard
from otel_guard import DelegationRefused, current_chain, delegate
from otel_guard.guard import Delegation


def hop(name: str) -> Delegation:
    return delegate(name)


def test_decide_carries_the_chain_and_starts_no_span(spans: Any) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        planner = hop("planner")
        ctx = planner.decide()
        assert not planner.opened
        assert planner.decision == "allow"
        token = context.attach(ctx)
        try:
            chain = current_chain()
            assert chain is not None
            assert chain.agents == ("planner",)
            assert trace.get_current_span() is caller  # the span is left as it was
        finally:
            context.detach(token)
    assert spans.named("invoke_agent planner") == []


def test_open_starts_the_span_under_the_given_parent_with_the_decided_chain(spans: Any) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("caller"):
        planner = hop("planner")
        planner.decide()
    with tracer.start_as_current_span("their span of the call") as theirs:
        ctx = planner.open(context.get_current())
    assert planner.opened
    assert planner.open() is ctx  # opened once
    token = context.attach(ctx)
    try:
        assert trace.get_current_span() is planner.span
        assert current_chain() == planner.chain
    finally:
        context.detach(token)
    planner.finish()
    span = spans.one("invoke_agent planner")
    assert span.parent is not None
    assert span.parent.span_id == theirs.get_span_context().span_id
    assert span.attributes is not None
    assert span.attributes["otel_guard.decision"] == "allow"


def test_a_decided_hop_never_opened_is_recorded_when_it_finishes(spans: Any) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        planner = hop("planner")
        planner.decide()
    planner.finish()
    span = spans.one("invoke_agent planner")
    assert span.parent is not None
    assert span.parent.span_id == caller.get_span_context().span_id


def test_decide_refuses_as_start_does_and_records_the_refused_span(spans: Any) -> None:
    otel_guard.configure(cycle_rule="agent")
    with delegate("planner"), delegate("budget"):
        again = hop("planner")
        with pytest.raises(DelegationRefused) as refused:
            again.decide()
    assert refused.value.reason == "cycle"
    assert again.decision == "refuse"
    [span] = [
        s for s in spans.named("invoke_agent planner") if s.attributes["otel_guard.decision"] == "refuse"
    ]
    assert span.status.status_code == trace.StatusCode.ERROR


def test_open_before_decide_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="decide"):
        hop("planner").open()
