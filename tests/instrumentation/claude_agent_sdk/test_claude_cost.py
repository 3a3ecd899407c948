"""A tree's budget in money in the Claude Agent SDK (issue 46): real ``query()`` runs of the real CLI
against the scripted Messages API on 127.0.0.1 (``claude_loop.py``).

Planner asks budget through its tool; budget answers at once. Every scripted reply reports 10 input
and 5 output tokens and the model ``claude-scripted``; the CLI sums them per model in its result's
``modelUsage``. At the ``prices`` file's 1,000 and 2,000 per million tokens a reply costs
10 * 1,000 + 5 * 2,000 = 20,000 micro-units (0.02): budget's run (one reply) 0.02, planner's (its tool
call and its answer) 0.04. The CLI's own ``total_cost_usd`` (its estimate from its bundled table,
which prices even this unknown model) is not what is counted.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from claude_agent_sdk import ResultMessage
from claude_loop import MODEL, scripted_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.claude_agent_sdk import ClaudeAgentSDKInstrumentor
from tests.hop_spans import hop_named

pytestmark = pytest.mark.integration

instrumented = instrumentor_fixture(ClaudeAgentSDKInstrumentor)

PRICES = {"claude-scripted": {"input": 1000, "output": 2000}}
PER_REPLY = 20_000


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


def test_every_run_of_the_tree_is_priced_by_its_model_usage(instrumented: ClaudeAgentSDKInstrumentor) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    with scripted_loop(max_tool_calls=1) as loop, otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        output, messages = asyncio.run(
            asyncio.wait_for(loop.run_messages("planner", "Plan the team offsite"), timeout=60)
        )
        assert loop.runs == {"planner": 1, "budget": 1}
        assert output.startswith("planner answers after budget answers")
        [result] = [m for m in messages if isinstance(m, ResultMessage)]
        assert result.total_cost_usd  # the CLI's own estimate, not counted: 3 replies are 0.06
        assert spent(hop.chain.root) == 3 * PER_REPLY


def test_a_tree_past_max_cost_refuses_its_next_request_and_hop(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.02", prices=PRICES)
    with scripted_loop(max_tool_calls=1) as loop, otel_guard.delegate("coordinator") as hop:
        asyncio.run(asyncio.wait_for(loop.run("planner", "Plan the team offsite"), timeout=60))
        # Budget's run spent 0.02: planner's answer, the tree's next reply, is refused (the CLI had
        # sent it: the run is spent, and any later tool call of it is denied).
        [event] = [
            e for e in hop_named(spans, "invoke_agent planner").events if e.name == "otel_guard.refused"
        ]
        assert event.attributes is not None
        assert event.attributes["otel_guard.budget.exhausted"] == "cost"
        assert "has spent its 0.02 USD (max_cost 0.02)" in str(event.attributes["otel_guard.message"])
        assert hop.chain is not None
        assert spent(hop.chain.root) == 3 * PER_REPLY  # the replies the CLI had sent are counted
        # The tree's next run is a hop of a spent tree: refused with reason budget.
        with pytest.raises(otel_guard.DelegationRefused, match=r"max_cost 0\.02") as refused:
            asyncio.run(asyncio.wait_for(loop.run("planner", "again"), timeout=60))
        assert refused.value.reason == "budget"
        assert loop.runs == {"planner": 1, "budget": 1}


def test_a_model_no_price_covers_is_unpriced(
    instrumented: ClaudeAgentSDKInstrumentor, metric_reader: Any
) -> None:
    otel_guard.configure(max_cost="1", budget_unpriced="refuse")
    with scripted_loop(max_tool_calls=1) as loop, otel_guard.delegate("coordinator"):
        asyncio.run(asyncio.wait_for(loop.run("planner", "Plan the team offsite"), timeout=60))
        # budget_unpriced=refuse: the tree had a response no price covers; its next run is refused.
        with pytest.raises(otel_guard.DelegationRefused, match="no price covers"):
            asyncio.run(asyncio.wait_for(loop.run("planner", "again"), timeout=60))
    counted = {
        attributes.get("gen_ai.request.model")
        for attributes, _ in metric_reader.points("otel_guard.budget.unpriced")
    }
    assert MODEL in counted
