"""Tree budgets in LlamaIndex: each agent step's model request is counted against the run's tree.

``max_model_requests`` and ``max_tokens`` (docs/settings.md) are checked before each request; a
request the tree may not make is not sent, and the run ends with ``TreeBudgetExceeded``, a
``WorkflowRuntimeError`` as LlamaIndex's own iteration limit is.
"""

from __future__ import annotations

from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from llama_index.core.tools import FunctionTool
from llama_index.core.workflow.errors import WorkflowRuntimeError
from llama_index_loop import CallBudget, ScriptedModel, agent, build_loop

import otel_guard
from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor
from otel_guard.instrumentation.llama_index._usage import TreeBudgetExceeded
from tests.hop_spans import guard_spans

instrumented = instrumentor_fixture(LlamaIndexInstrumentor)


async def test_the_request_past_max_model_requests_is_not_sent_and_ends_the_run(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2)
    loop = build_loop(max_tool_calls=1)  # planner asks budget once; budget answers

    with pytest.raises(TreeBudgetExceeded) as raised:
        await loop.planner().run(user_msg="Plan the team offsite")

    # Planner's first request and budget's were made; planner's second (to answer) was not sent.
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)
    assert isinstance(raised.value, WorkflowRuntimeError)
    assert "has made its 2 model requests (max_model_requests 2); the model request is refused" in str(
        raised.value
    )
    planner_hop = guard_spans(spans)[0]
    assert planner_hop.name == "invoke_agent planner"
    (event,) = [e for e in planner_hop.events if e.name == "otel_guard.refused"]
    assert event.attributes is not None
    assert event.attributes["otel_guard.reason"] == "budget"


async def test_a_spent_tree_ends_the_sub_agent_and_its_caller_reads_why(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(max_model_requests=1)
    loop = build_loop(max_tool_calls=1)

    with pytest.raises(TreeBudgetExceeded):
        await loop.planner().run(user_msg="Plan the team offsite")

    # Budget's only request was refused inside ask_budget: the tool failed with the reason, and
    # the planner's next request (to answer from it) was refused in turn.
    assert loop.budget_model.requests == []
    assert len(loop.planner_model.requests) == 1


async def test_tokens_the_provider_reports_count_against_max_tokens(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(max_tokens=15)
    calls = CallBudget(1)

    def lookup(question: str) -> str:
        """Look something up."""
        return question

    model = ScriptedModel("searcher", "lookup", calls, tokens=(10, 5))
    searcher = agent("searcher", model, [FunctionTool.from_defaults(fn=lookup)])

    with pytest.raises(TreeBudgetExceeded, match=r"max_tokens 15"):
        await searcher.run(user_msg="find")

    # The first response (a tool call) reported 10 + 5 tokens: the tree had spent its 15, so the
    # request to answer from the tool's result was not sent.
    assert len(model.requests) == 1


async def test_observe_mode_records_the_request_and_sends_it(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=1, mode="observe")
    model = ScriptedModel("solo", None, CallBudget(0))

    output = await agent("solo", model, []).run(user_msg="a")

    assert str(output) == "solo answers without tools"
    (hop,) = guard_spans(spans)
    assert [e.name for e in hop.events] == []  # one request: within the budget

    model_two = ScriptedModel("searcher", "lookup", CallBudget(1))

    def lookup(question: str) -> str:
        """Look something up."""
        return question

    spans.clear()
    await agent("searcher", model_two, [FunctionTool.from_defaults(fn=lookup)]).run(user_msg="find")
    assert len(model_two.requests) == 2  # the second was past the budget, and sent
    run_hop = next(s for s in guard_spans(spans) if s.name == "invoke_agent searcher")
    assert [e.name for e in run_hop.events] == ["otel_guard.would_refuse"]


async def test_without_a_model_budget_nothing_is_counted(
    instrumented: LlamaIndexInstrumentor, spans: Any
) -> None:
    loop = build_loop(max_tool_calls=1)

    await loop.planner().run(user_msg="Plan the team offsite")

    assert all(not s.events for s in guard_spans(spans))
