"""A tree's budget in money in pydantic-ai (issue 44.4, 44.5), with pydantic-ai's ``FunctionModel``.

Planner asks budget through a tool; each response reports its model name and its usage (1,000 input
tokens, 100 output) as a provider's would, so each is priced: at the ``prices`` file's 10 and 100 per
million tokens, 20,000 micro-units (0.02). The field's failures, here as tests: a budget tripping in
a sub-agent reaches its caller as the tool's failure and the root run ends (claude-agent-sdk-python
#1273: it hung); a sub-agent's own fresh ``UsageLimits`` never resets the tree's count; eleven sibling
tool calls are not depth.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import genai_prices
import pytest
from pydantic_ai import Agent, Tool, capture_run_messages
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

import otel_guard
from otel_guard._prices import micros
from otel_guard.budget import store_for
from otel_guard.instrumentation.pydantic_ai import PydanticAIInstrumentor
from tests.instrumentation.instrumentors import instrumentor_fixture

instrumented = instrumentor_fixture(PydanticAIInstrumentor)

PRICES = {"acme-*": {"input": 10, "output": 100}}
PER_RESPONSE = 1000 * 10 + 100 * 100  # 20,000 micro-units


class Scripted:
    """A model that calls ``tool`` ``calls`` times, one call a response, then answers; every response
    reports 1,000 input and 100 output tokens (and ``charged``, as OpenRouter's ``usage.cost``)."""

    def __init__(self, tool: str | None, calls: int = 1, charged: float | None = None) -> None:
        self.tool, self.calls, self.charged = tool, calls, charged
        self.requests = 0
        self.failures: list[str] = []

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        returned = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        self.failures += [str(p.content) for p in returned if p.outcome == "failed"]
        if self.tool is not None and self.calls > 0:
            self.calls -= 1
            parts: list[Any] = [ToolCallPart(self.tool, {"question": "how much?"})]
        else:
            parts = [TextPart("done")]
        details = {"cost": self.charged} if self.charged is not None else None
        usage = RequestUsage(input_tokens=1000, output_tokens=100)
        return ModelResponse(parts=parts, usage=usage, provider_details=details)


def agents(model_name: str = "acme-large", charged: float | None = None, budget_calls: int = 0) -> Any:
    planner_model, budget_model = Scripted("ask_budget", charged=charged), Scripted("lookup", budget_calls)

    async def ask_budget(question: str) -> str:
        """Ask the budget agent."""
        # The sub-agent's own run limits, fresh for its run, as pydantic-ai gives every run.
        return (await budget.run(question, usage_limits=UsageLimits(request_limit=50))).output

    def lookup(question: str) -> str:
        """Look a figure up."""
        return "42"

    planner: Agent[None, str] = Agent(
        FunctionModel(planner_model.respond, model_name=model_name), name="planner", tools=[Tool(ask_budget)]
    )
    budget: Agent[None, str] = Agent(
        FunctionModel(budget_model.respond, model_name=model_name), name="budget", tools=[Tool(lookup)]
    )
    return planner, planner_model, budget_model


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


async def test_every_response_of_the_tree_is_priced_from_the_prices_file(
    instrumented: PydanticAIInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, planner_model, budget_model = agents()
    async with otel_guard.delegate("coordinator") as tree:
        assert tree.chain is not None
        await planner.run("plan the offsite")
    assert (planner_model.requests, budget_model.requests) == (2, 1)
    assert spent(tree.chain.root) == 3 * PER_RESPONSE


async def test_a_cost_the_provider_reported_comes_before_the_prices_file(
    instrumented: PydanticAIInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    planner, _, _ = agents(charged=0.0005)  # the planner's responses: 500 micro-units, as charged
    async with otel_guard.delegate("coordinator") as tree:
        assert tree.chain is not None
        await planner.run("plan the offsite")
    assert spent(tree.chain.root) == 2 * 500 + PER_RESPONSE


async def test_genai_prices_prices_a_model_the_file_does_not_name(
    instrumented: PydanticAIInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1")
    planner, _, _ = agents(model_name="gpt-4o")
    async with otel_guard.delegate("coordinator") as tree:
        assert tree.chain is not None
        await planner.run("plan the offsite")
    one = micros(
        genai_prices.calc_price(
            genai_prices.Usage(input_tokens=1000, output_tokens=100), "gpt-4o"
        ).total_price
    )
    assert spent(tree.chain.root) == 3 * one


async def test_a_budget_spent_in_a_sub_agent_reaches_the_caller_as_a_tool_failure_and_the_run_ends(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="0.05", prices=PRICES)
    planner, planner_model, budget_model = agents(budget_calls=5)
    started = time.monotonic()
    with capture_run_messages() as messages, pytest.raises(UsageLimitExceeded) as ended:
        await asyncio.wait_for(planner.run("plan the offsite"), timeout=20)
    assert time.monotonic() - started < 20
    # planner's first response (0.02), budget's first (0.04) and second (0.06: past the cap by this
    # one response); budget's second lookup is a refused hop, and its next request is refused inside
    # its run.
    assert (planner_model.requests, budget_model.requests) == (1, 2)
    allowed, refused = spans.named("execute_tool lookup")
    assert allowed.attributes["otel_guard.decision"] == "allow"  # at 0.04
    assert refused.attributes["otel_guard.reason"] == "budget"  # at 0.06
    assert refused.attributes["otel_guard.budget.exhausted"] == "cost"
    # The sub-agent's refusal reached the planner as its tool's failed result ...
    [failed] = [
        part
        for message in messages
        for part in getattr(message, "parts", ())
        if isinstance(part, ToolReturnPart) and part.tool_name == "ask_budget"
    ]
    assert failed.outcome == "failed"
    assert "has spent its 0.05 USD (max_cost 0.05); the model request is refused" in str(failed.content)
    # ... and the planner's next request, in the same spent tree, ended the root run.
    assert "has spent its 0.05 USD (max_cost 0.05); the model request is refused" in str(ended.value)
    assert isinstance(ended.value, UsageLimitExceeded)
    tool = spans.one("execute_tool ask_budget")
    assert tool.status.status_code.name == "ERROR"


async def test_a_nested_runs_own_fresh_limits_do_not_reset_the_trees_count(
    instrumented: PydanticAIInstrumentor,
) -> None:
    """Each run of budget gets pydantic-ai's own fresh ``UsageLimits(request_limit=1)``: each makes its
    one request; the tree's spend goes on over them, and the run past ``max_cost`` is refused."""
    otel_guard.configure(max_cost="0.05", prices=PRICES)
    _, _, budget_model = agents()
    budget: Agent[None, str] = Agent(
        FunctionModel(budget_model.respond, model_name="acme-large"), name="budget"
    )
    made = 0
    async with otel_guard.delegate("coordinator") as tree:
        assert tree.chain is not None
        for _ in range(3):
            await budget.run("how much?", usage_limits=UsageLimits(request_limit=1))
            made += 1
        with pytest.raises(otel_guard.DelegationRefused, match=r"max_cost 0\.05") as refused:
            await budget.run("how much?", usage_limits=UsageLimits(request_limit=1))
    assert made == 3
    assert budget_model.requests == 3
    assert refused.value.reason == "budget"
    assert spent(tree.chain.root) == 3 * PER_RESPONSE


async def test_eleven_sibling_tool_calls_are_not_depth(
    instrumented: PydanticAIInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)  # max_depth stays 8
    model = Scripted("lookup", calls=11)

    def lookup(question: str) -> str:
        """Look a figure up."""
        return "42"

    agent: Agent[None, str] = Agent(
        FunctionModel(model.respond, model_name="acme-large"), name="planner", tools=[Tool(lookup)]
    )
    async with otel_guard.delegate("coordinator") as tree:
        assert tree.chain is not None
        assert (await agent.run("look eleven things up")).output == "done"
    lookups = spans.named("execute_tool lookup")
    assert len(lookups) == 11
    assert {s.attributes["otel_guard.decision"] for s in lookups} == {"allow"}
    assert {s.attributes["otel_guard.chain.depth"] for s in lookups} == {3}  # coordinator, planner, lookup
    assert model.failures == []
    assert spent(tree.chain.root) == 12 * PER_RESPONSE
