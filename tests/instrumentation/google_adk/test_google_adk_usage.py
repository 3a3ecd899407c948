"""A tree's model requests and tokens in Google ADK: counted over every run of the tree, and a request
the tree may not make ends the run with ADK's own limit error.

Planner asks budget through an ``AgentTool``; budget answers at once. The tree's model requests:
planner's tool call, budget's answer, planner's answer: three, in two runners (the ``AgentTool`` runs
budget in one of its own). Each response reports 14 tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.adk.agents.invocation_context import LlmCallsLimitExceededError
from google_adk_models import TOKENS_PER_RESPONSE, Pair, agents_as_tools, final_text, run

import otel_guard
from otel_guard.instrumentation.google_adk import GoogleADKInstrumentor
from otel_guard.instrumentation.google_adk._usage import TreeBudgetExceeded
from tests.hop_spans import hop_named
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(GoogleADKInstrumentor)


def tree() -> Pair:
    return agents_as_tools(max_tool_calls=1)  # planner's one call; budget then answers without one


async def test_a_tree_that_made_its_model_requests_ends_the_run_with_adks_limit_error(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    pair = tree()

    with pytest.raises(
        LlmCallsLimitExceededError, match=r"has made its 2 model requests \(max_model_requests 2\)"
    ) as ended:
        await run(pair.planner)

    assert isinstance(ended.value, TreeBudgetExceeded)
    # planner's tool call and budget's answer were made; planner's answer, in the same tree, was not.
    assert (len(pair.planner_model.requests), len(pair.budget_model.requests)) == (1, 1)
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


async def test_with_room_for_them_every_request_is_made(instrumented: GoogleADKInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    pair = tree()

    events = await run(pair.planner)

    assert final_text(events) == "planner answers after budget ok"
    assert (len(pair.planner_model.requests), len(pair.budget_model.requests)) == (2, 1)


async def test_the_runs_of_one_tree_share_its_budget_and_two_trees_have_their_own(
    instrumented: GoogleADKInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own three
        await run(tree().planner)
    with otel_guard.delegate("coordinator"):  # one tree for both runs: six wanted, three allowed
        await run(tree().planner)
        # The tree made its requests: the next run is a hop the tree may not make either.
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            await run(tree().planner)
    assert refused.value.reason == "budget"


async def test_a_tree_that_spent_its_tokens_makes_no_more_hops_nor_requests(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_tokens=2 * TOKENS_PER_RESPONSE)  # exactly one response's worth
    pair = tree()

    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 14 model tokens \(max_tokens 14\)"):
        await run(pair.planner)

    # planner's first response spent the tree's tokens: the call into budget was refused (the model
    # read why), and planner's next request ended the run.
    assert (len(pair.planner_model.requests), len(pair.budget_model.requests)) == (1, 0)
    refused = hop_named(spans, "invoke_agent budget")
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.budget.exhausted"] == "tokens"


async def test_observe_mode_lets_the_requests_through_and_records_would_refuse(
    instrumented: GoogleADKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    pair = tree()

    events = await run(pair.planner)

    assert final_text(events) == "planner answers after budget ok"
    would = sorted(
        (s.name, str(e.attributes.get("otel_guard.budget.exhausted", "")))
        for s in spans.all()
        for e in s.events
        if e.name == "otel_guard.would_refuse" and e.attributes is not None
    )
    # budget's hop (its span says which budget) and the two requests after the tree's first.
    assert would == [
        ("invoke_agent budget", ""),
        ("invoke_agent budget", "model_requests"),
        ("invoke_agent planner", "model_requests"),
    ]
    assert (
        hop_named(spans, "invoke_agent budget").attributes["otel_guard.budget.exhausted"] == "model_requests"
    )
