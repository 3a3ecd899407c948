"""A tree's model requests and tokens in smolagents: counted over the tree's every run.

Planner asks budget through a tool; budget answers at once. The tree's model requests: planner's
first (the tool call), budget's one, planner's answer: three, in two runs of two agents. Each
scripted response reports 10 input and 5 output tokens.
"""

from __future__ import annotations

from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from smolagents.utils import AgentGenerationError
from smolagents_loop import Ask, CallBudget, Loop, ScriptedModel, StreamingScriptedModel, agent, build_loop

import otel_guard
from otel_guard.instrumentation.smolagents import SmolagentsInstrumentor
from otel_guard.instrumentation.smolagents._usage import TreeBudgetExceeded
from tests.hop_spans import assert_observe_mode_recorded_the_spent_requests, hop_named

instrumented = instrumentor_fixture(SmolagentsInstrumentor)


def tree(model: type[ScriptedModel] = ScriptedModel) -> Loop:
    return build_loop(max_tool_calls=1, model=model)  # planner's one tool call; budget then answers


@pytest.mark.parametrize("model", [ScriptedModel, StreamingScriptedModel], ids=["generate", "stream"])
def test_a_tree_that_made_its_model_requests_ends_the_run_with_smolagents_generation_error(
    instrumented: SmolagentsInstrumentor, spans: Any, model: type[ScriptedModel]
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = tree(model)
    planner = loop.planner()

    with pytest.raises(
        AgentGenerationError, match=r"has made its 2 model requests \(max_model_requests 2\)"
    ) as e:
        planner.run("plan the offsite")

    # Planner's tool call and budget's answer were made; planner's third request, in its own run
    # but the same tree, was not sent.
    assert isinstance(e.value.__cause__, TreeBudgetExceeded)
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)
    assert planner.model is loop.planner_model  # the agent's own model is back
    [event] = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "budget"
    assert event.attributes["otel_guard.budget.exhausted"] == "model_requests"


def test_with_room_for_them_every_request_is_made(instrumented: SmolagentsInstrumentor) -> None:
    otel_guard.configure(max_model_requests=3)
    loop = tree()

    output = loop.planner().run("plan the offsite")

    assert str(output).startswith("planner answers after Observation:\nbudget answers without tools")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)


def test_each_run_of_a_tree_counts_in_the_same_budget_and_two_trees_apart(
    instrumented: SmolagentsInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=3)
    for _ in range(2):  # two trees, each within its own budget of three
        tree().planner().run("plan the offsite")
    with otel_guard.delegate("coordinator"):  # one tree for both runs: 6 requests wanted, 3 allowed
        tree().planner().run("plan the offsite")
        # The tree made its requests: the next run is a hop the tree may not make either.
        with pytest.raises(otel_guard.DelegationRefused, match="has made its 3 model requests") as refused:
            tree().planner().run("plan it again")
    assert refused.value.reason == "budget"


@pytest.mark.parametrize("model", [ScriptedModel, StreamingScriptedModel], ids=["generate", "stream"])
def test_a_tree_that_spent_its_tokens_makes_no_more_requests_nor_hops(
    instrumented: SmolagentsInstrumentor, spans: Any, model: type[ScriptedModel]
) -> None:
    # One token: the first request may be made (nothing spent yet) and spends fifteen.
    otel_guard.configure(max_tokens=1)
    loop = tree(model)

    with pytest.raises(AgentGenerationError, match=r"has spent its 1 model tokens \(max_tokens 1\)"):
        loop.planner().run("plan the offsite")

    assert len(loop.planner_model.requests) == 1
    assert loop.budget_model.requests == []  # the tool hop that would run budget was refused
    refused = hop_named(spans, "execute_tool ask_budget")
    assert refused.attributes["otel_guard.decision"] == "refuse"
    assert refused.attributes["otel_guard.budget.exhausted"] == "tokens"


def test_observe_mode_lets_the_requests_through_and_records_would_refuse(
    instrumented: SmolagentsInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    loop = tree()

    output = loop.planner().run("plan the offsite")

    assert str(output).startswith("planner answers after")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)
    # Planner's first request is the tree's one; the hops after it and the requests after them
    # would have been refused.
    assert_observe_mode_recorded_the_spent_requests(spans)


def test_the_model_is_the_agents_own_to_everything_but_the_count(
    instrumented: SmolagentsInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=10)
    model = ScriptedModel("searcher", "lookup", CallBudget(1))
    seen: list[tuple[bool, bool]] = []
    searcher: Any = None

    def look(question: str) -> str:
        seen.append((isinstance(searcher.model, ScriptedModel), hasattr(searcher.model, "generate_stream")))
        return "found"

    searcher = agent("searcher", model, [Ask("lookup", "Look something up.", look)])
    searcher.run("find")

    # During the run: an instance of the model's class, with no generate_stream it does not have.
    assert seen == [(True, False)]
    assert searcher.model is model


def test_with_the_usage_budgets_off_the_model_is_left_alone(instrumented: SmolagentsInstrumentor) -> None:
    model = ScriptedModel("searcher", "lookup", CallBudget(1))
    models: list[Any] = []
    searcher: Any = None
    searcher = agent(
        "searcher", model, [Ask("lookup", "Look.", lambda q: models.append(searcher.model) or "x")]
    )

    searcher.run("find")

    assert models == [model]
    assert models[0] is model
