"""A tree's budget in money in LlamaIndex (issue 44.4), with LlamaIndex's ``MockFunctionCallingLLM``.

Planner asks budget through a tool; budget answers. Each response's raw form is what OpenAI's is: it
names its model and reports its usage (1,000 prompt tokens, 400 of them cached; 100 completion
tokens). At the ``prices`` file's 10 (input), 1 (cached) and 100 (output) per million tokens a
response costs 600 * 10 + 400 + 100 * 100 = 16,400 micro-units.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import pytest
from instrumentors import instrumentor_fixture
from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index_loop import Loop, ScriptedModel, build_loop

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.llama_index import LlamaIndexInstrumentor
from otel_guard.instrumentation.llama_index._usage import TreeBudgetExceeded

instrumented = instrumentor_fixture(LlamaIndexInstrumentor)

PRICES = {"acme-*": {"input": 10, "output": 100, "cache_read": 1}}
PER_RESPONSE = 600 * 10 + 400 + 100 * 100


class OpenAILikeLLM(MockFunctionCallingLLM):
    """A mock LLM whose streamed responses carry OpenAI's raw form: the model, the usage (and, given
    ``charged``, OpenRouter's ``usage.cost``)."""

    served_model: str = "acme-large-2025"
    charged: float | None = None

    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> Any:
        responses = await super().astream_chat(messages, **kwargs)
        usage: dict[str, Any] = {
            "prompt_tokens": 1000,
            "completion_tokens": 100,
            "prompt_tokens_details": {"cached_tokens": 400},
        }
        if self.charged is not None:
            usage["cost"] = self.charged
        raw = {"model": self.served_model, "usage": usage}

        async def reported() -> AsyncGenerator[ChatResponse, None]:
            async for response in responses:
                yield response.model_copy(update={"raw": raw})

        return reported()


class PricedModel(ScriptedModel):
    charged: float | None = None

    def llm(self) -> MockFunctionCallingLLM:
        return OpenAILikeLLM(response_generator=self.respond, charged=self.charged)


def tree(charged: float | None = None) -> Loop:
    loop = build_loop(max_tool_calls=1)
    loop.planner_model = PricedModel("planner", "ask_budget", loop.calls)
    loop.budget_model = PricedModel("budget", "ask_planner", loop.calls)
    loop.planner_model.charged = loop.budget_model.charged = charged  # type: ignore[attr-defined]
    return loop


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


async def test_every_response_is_priced_by_the_model_its_raw_form_names(
    instrumented: LlamaIndexInstrumentor,
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        await loop.planner().run(user_msg="Plan the team offsite")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


async def test_a_cost_the_provider_reported_comes_first(instrumented: LlamaIndexInstrumentor) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree(charged=0.0005)
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        await loop.planner().run(user_msg="Plan the team offsite")
    assert spent(hop.chain.root) == 3 * 500


async def test_a_tree_past_max_cost_is_not_sent_another_request(instrumented: LlamaIndexInstrumentor) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    loop = tree()
    with pytest.raises(TreeBudgetExceeded, match=r"has spent its 0\.03 USD \(max_cost 0\.03\)"):
        await loop.planner().run(user_msg="Plan the team offsite")
    assert (len(loop.planner_model.requests), len(loop.budget_model.requests)) == (1, 1)  # 0.0164, 0.0328
