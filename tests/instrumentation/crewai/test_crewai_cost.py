"""A tree's budget in money in CrewAI (issue 44.4), with the tests' ``BaseLLM`` subclass.

Planner asks budget through a tool; budget answers. The scripted LLM (``model="scripted"``) reports
each request's prompt and completion tokens (8) to CrewAI's own accounting, as CrewAI's LLMs do; the
guard reads what that accounting grew by. At the ``prices`` file's 1 (input) and 1,000 (output) per
million tokens a request costs its prompt tokens plus 8,000 micro-units.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from crewai_app import Loop, build_loop

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.crewai._usage import TreeBudgetExceeded

PRICES = {"scripted": {"input": 1, "output": 1000}}


def tree() -> Loop:
    loop = build_loop(max_tool_calls=1)
    loop.budget_model.max_tool_calls = 0  # budget answers without delegating back
    return loop


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


def priced(loop: Loop) -> int:
    """What the tree's requests cost at PRICES: each reported prompt + 8 tokens to CrewAI."""
    usages = [*loop.planner_model.usages, *loop.budget_model.usages]
    return sum(tokens - 8 for tokens in usages) + 8 * 1000 * len(usages)


def test_every_request_of_the_tree_is_priced_by_the_llms_model(instrumented: Any) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        loop.run()
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)
    assert spent(hop.chain.root) == priced(loop)


def test_a_tree_past_max_cost_ends_the_run_with_crewai_s_hook_abort(instrumented: Any) -> None:
    otel_guard.configure(max_cost="0.000001", prices=PRICES)  # one micro-unit: the first request spends more
    loop = tree()
    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 0\.000001 USD \(max_cost 0\.000001\)"):
        loop.run()
    assert len(loop.planner_model.requests) == 1
    assert loop.budget_model.requests == []  # the tool hop that would run budget was refused
