"""A tree's budget in money in Agent Framework (issue 44.4), with the tests' scripted chat client.

Planner asks budget through a tool; budget answers. Each scripted response reports 10 input and 5
output tokens in its ``usage_details``, and each client names its model (``model``:
``scripted-planner``, ``scripted-budget``), as Agent Framework's clients do; at the ``prices`` file's
1,000 and 2,000 per million tokens a response costs 20,000 micro-units (0.02).
"""

from __future__ import annotations

import time

import pytest
from agent_framework import ChatResponse, Message
from agent_framework_loop import Loop, build_loop
from agent_framework_support import instrumented_fixture

import otel_guard
from otel_guard.budget import store_for
from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor
from otel_guard.instrumentation.agent_framework._usage import model_usage

instrumented = instrumented_fixture()

PRICES = {"scripted-*": {"input": 1000, "output": 2000}}
PER_RESPONSE = 20_000


def tree() -> Loop:
    return build_loop(max_tool_calls=1)


def spent(root: str) -> int:
    settings = otel_guard.settings.current_settings()
    return store_for(settings).used(f"tree:{settings.workspace}:{root}:cost", time.time())  # type: ignore[attr-defined]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
async def test_every_response_of_the_tree_is_priced_by_its_clients_model(
    instrumented: AgentFrameworkInstrumentor, streamed: bool
) -> None:
    otel_guard.configure(max_cost="1", prices=PRICES)
    loop = tree()
    async with otel_guard.delegate("coordinator") as hop:
        assert hop.chain is not None
        if streamed:
            stream = loop.planner.run("plan the offsite", stream=True)
            async for _update in stream:
                pass
            await stream.get_final_response()
        else:
            await loop.planner.run("plan the offsite")
    assert (len(loop.planner_client.requests), len(loop.budget_client.requests)) == (2, 1)
    assert spent(hop.chain.root) == 3 * PER_RESPONSE


async def test_a_tree_past_max_cost_ends_the_run_with_a_last_answer(
    instrumented: AgentFrameworkInstrumentor,
) -> None:
    otel_guard.configure(max_cost="0.03", prices=PRICES)
    loop = tree()
    result = await loop.planner.run("plan the offsite")
    assert "has spent its 0.03 USD (max_cost 0.03)" in result.text
    assert result.finish_reason == "length"
    assert (len(loop.planner_client.requests), len(loop.budget_client.requests)) == (1, 1)


def test_the_model_a_response_names_and_a_cost_its_provider_reported_come_first() -> None:
    response = ChatResponse(
        messages=[Message(role="assistant", contents=["ok"])],
        usage_details={
            "input_token_count": 1000,
            "output_token_count": 10,
            "cache_read_input_token_count": 600,
        },
        model="gpt-4o-2024-08-06",
        raw_representation={"usage": {"cost": 0.0042}},
    )
    usage = model_usage(response, "gpt-4o")
    assert (usage.model, usage.input_tokens, usage.cache_read_tokens) == ("gpt-4o-2024-08-06", 1000, 600)
    assert str(usage.reported_cost) == "0.0042"
    bare = ChatResponse(messages=[Message(role="assistant", contents=["ok"])])
    assert model_usage(bare, "scripted-planner").model == "scripted-planner"
