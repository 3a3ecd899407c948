"""A tree's budget in money in DSPy (issue 46), on the tests' scripted ``DummyLM``.

Planner asks budget through a tool; budget answers at once. Each scripted response reports 5 input
and 5 output tokens and the model that answered (``scripted-planner``, ``scripted-budget``), as
DSPy's ``Response.model`` does; at the ``prices`` file's 1,000 and 2,000 per million tokens a response
costs 5 * 1,000 + 5 * 2,000 = 15,000 micro-units (0.015). The tree's five requests: planner's step,
budget's step and extract, planner's step and extract.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from dspy.clients.engines.dummy_engine import AsyncDummyEngine
from dspy.lm15 import Response
from dspy_loop import Loop, ScriptedLM, _ScriptedEngine, build_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.dspy import DSPyInstrumentor
from otel_guard.instrumentation.dspy._usage import TreeBudgetExceeded
from tests.hop_spans import hop_named

instrumented = instrumentor_fixture(DSPyInstrumentor)

PRICES = {"scripted-*": {"input": 1000, "output": 2000}}
PER_RESPONSE = 15_000


class _NamedEngine(_ScriptedEngine):
    """The scripted engine, its responses naming the model that answered: ``scripted-<agent>``."""

    def _complete_messages(self, messages: list[dict[str, Any]]) -> Any:
        response: Response = super()._complete_messages(messages)
        return Response(
            id=response.id,
            model=f"scripted-{self.owner.agent}",
            message=response.message,
            finish_reason=response.finish_reason,
            usage=response.usage,
        )


def named(lm: ScriptedLM) -> ScriptedLM:
    lm._engine_spec = _NamedEngine(lm)
    lm._async_engine_spec = AsyncDummyEngine(lm._engine_spec)
    return lm


def tree() -> Loop:
    loop = build_loop(calls=1)
    named(loop.planner_lm)
    named(loop.budget_lm)
    return loop


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


def test_every_response_of_the_tree_is_priced_by_the_model_that_answered(
    instrumented: DSPyInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        answer = loop.planner()(question="plan the offsite").answer
    assert answer == "planner answers after budget answers after Completed."
    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (3, 2)
    assert spent(hop.chain.root) == 5 * PER_RESPONSE


def test_a_tree_past_max_cost_ends_the_run_with_the_refusal(
    instrumented: DSPyInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    loop = tree()
    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 0\.03 USD \(max_cost 0\.03\)"):
        loop.planner()(question="plan the offsite")
    # 0.015 after planner's step, 0.03 after budget's: budget's extract and planner's next step refused.
    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (1, 1)
    events = [e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"]
    assert events
    assert events[-1].attributes is not None
    assert events[-1].attributes["otel_guard.budget.exhausted"] == "cost"


def test_a_model_no_price_covers_is_unpriced(instrumented: DSPyInstrumentor, metric_reader: Any) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse")
    loop = tree()
    with pytest.raises(TreeBudgetExceeded, match="no price covers"):
        loop.planner()(question="plan the offsite")
    assert (loop.planner_lm.requests, loop.budget_lm.requests) == (1, 0)
    counted = {
        attributes.get("gen_ai.request.model")
        for attributes, _ in metric_reader.points("otel_guard.budget.unpriced")
    }
    assert "scripted-planner" in counted
