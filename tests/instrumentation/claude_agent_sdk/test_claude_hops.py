"""The Claude Agent SDK under otel-guard: runs, sub-agents and SDK MCP tool calls are hops, and a
refusal reaches the model as the call's error result, with the refusal's text: an SDK MCP tool's own
error result when its server refused the call, the CLI's denial when a hook did.

Real ``query()`` runs of the real SDK and the Claude Code CLI it bundles, against the scripted
Messages API of ``scripted_api.py`` on 127.0.0.1 (``claude_loop.py``); spans and metrics go to the
session's in-memory SDK.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from claude_agent_sdk import ResultMessage
from claude_loop import scripted_loop
from instrumentors import instrumentor_fixture

import otel_guard
from otel_guard.instrumentation.claude_agent_sdk import ClaudeAgentSDKInstrumentor
from tests.hop_spans import decisions, guard_spans, hop_named, refused

pytestmark = pytest.mark.integration

instrumented = instrumentor_fixture(ClaudeAgentSDKInstrumentor)

REFUSED = "Refused by otel-guard (a2a_delegation_cycle, reason: cycle): Delegation cycle:"


def test_the_loop_through_tools_is_stopped_at_the_first_bounce(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    with scripted_loop() as loop:
        output = asyncio.run(loop.run("planner", "Plan the team offsite"))

    # planner asked budget (tool `budget`, budget's run inside it: one hop); budget's call back into
    # planner was refused by its server before its tool ran: one run each, two tool calls, both
    # answered, the refusal as the tool's error result.
    assert (loop.runs, loop.calls.made) == ({"planner": 1, "budget": 1}, 2)
    (text,) = loop.results["budget"]
    assert text.startswith(REFUSED)
    assert loop.errors["budget"] == [True]
    assert "agent planner is already in chain planner → budget." in text
    assert "do not call it again" in text
    assert output.startswith("planner answers after budget answers after " + REFUSED)
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("execute_tool budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    (refusal,) = refused(spans)
    assert refusal.attributes is not None
    assert refusal.attributes["otel_guard.reason"] == "cycle"
    assert len({span.context.trace_id for span in guard_spans(spans)}) == 1


def test_the_loop_through_a_sub_agent_is_stopped_at_the_first_bounce(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    with scripted_loop(subagents=True) as loop:
        asyncio.run(loop.run("planner", "Plan the team offsite"))

    # planner started its sub-agent budget (the Agent tool); budget's call of the `planner` tool
    # was refused in the sub-agent's hop: the sub-agent read the refusal and answered, and so did
    # planner.
    assert (loop.runs, loop.calls.made) == ({"planner": 1, "budget": 1}, 2)
    (text,) = loop.results["budget"]
    assert text.startswith(REFUSED)
    assert loop.errors["budget"] == [True]
    assert "agent planner is already in chain planner → budget." in text
    assert decisions(spans) == [
        ("invoke_agent planner", "allow", ("planner",)),
        ("invoke_agent budget", "allow", ("planner", "budget")),
        ("execute_tool planner", "refuse", ("planner", "budget", "planner")),
    ]
    budget = hop_named(spans, "invoke_agent budget")
    assert budget.end_time is not None  # the sub-agent's hop ended when it stopped
    call = hop_named(spans, "execute_tool planner")
    assert call.parent is not None
    assert call.parent.span_id == budget.context.span_id


def test_a_healthy_run_is_unchanged(instrumented: ClaudeAgentSDKInstrumentor, spans: Any) -> None:
    with scripted_loop(max_tool_calls=1) as loop:
        guarded = asyncio.run(loop.run("planner", "Plan the team offsite"))
    instrumented.uninstrument()
    try:
        with scripted_loop(max_tool_calls=1) as loop:
            plain = asyncio.run(loop.run("planner", "Plan the team offsite"))
    finally:
        instrumented.instrument()

    assert guarded == plain == "planner answers after budget answers without tools"
    assert [d[:2] for d in decisions(spans)] == [
        ("invoke_agent planner", "allow"),
        ("execute_tool budget", "allow"),
    ]


def test_observe_mode_lets_the_loop_through_and_records_it(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any, metric_reader: Any
) -> None:
    otel_guard.configure(mode="observe", cycle_rule="agent")
    with scripted_loop(max_tool_calls=3) as loop:
        asyncio.run(loop.run("planner", "Plan the team offsite"))

    assert loop.calls.made == 3  # the scripts' own bound
    assert loop.runs["planner"] == 2  # budget's call of `planner`, which would be refused, ran
    assert not any("Refused" in text for text in loop.results.get("budget", []))
    would = [
        s
        for s in guard_spans(spans)
        if s.attributes and s.attributes["otel_guard.decision"] == "would_refuse"
    ]
    assert would
    assert would[0].name == "execute_tool planner"
    assert refused(spans) == []


# -- budgets: a refusal deep in a sub-agent ends the root run (claude-agent-sdk-python #1273) -----


def test_a_budget_spent_inside_a_sub_agent_ends_the_parent_with_a_result(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    otel_guard.configure(max_model_requests=2, cycle_rule="none")  # the budget, not the cycle, stops it
    started = time.monotonic()
    with scripted_loop(subagents=True) as loop:
        output, messages = asyncio.run(
            asyncio.wait_for(loop.run_messages("planner", "Plan the team offsite"), timeout=60)
        )
    took = time.monotonic() - started

    # planner's request and the sub-agent's were made; the sub-agent's call of `planner` came from a
    # spent tree: denied with the budget's refusal, and the run's turn ended. The parent got its
    # result and the stream ended: no hang.
    results = [m for m in messages if isinstance(m, ResultMessage)]
    assert results, [type(m).__name__ for m in messages]
    assert took < 30
    assert loop.runs.get("planner") == 1  # the planner run the sub-agent asked for never started
    denied = [t for t in loop.results.get("budget", []) if "max_model_requests 2" in t]
    assert denied, loop.results
    assert "Delegation budget" in denied[0]
    refusals = [s for s in refused(spans) if s.attributes and s.attributes["otel_guard.reason"] == "budget"]
    assert refusals
    assert output is not None


def test_a_client_session_is_one_run_and_its_refusal_reaches_the_model(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    from claude_agent_sdk import ClaudeSDKClient

    async def session(loop: Any) -> list[Any]:
        async with ClaudeSDKClient(options=loop.options("planner")) as client:
            await client.query("Plan the team offsite")
            return [message async for message in client.receive_response()]

    with scripted_loop() as loop:
        messages = asyncio.run(asyncio.wait_for(session(loop), timeout=60))

    (result,) = [m for m in messages if isinstance(m, ResultMessage)]
    assert result.result is not None
    assert result.result.startswith("planner answers after budget answers after " + REFUSED)
    assert [d[:2] for d in decisions(spans)] == [
        ("invoke_agent planner", "allow"),
        ("execute_tool budget", "allow"),
        ("execute_tool planner", "refuse"),
    ]
    assert all(span.end_time is not None for span in guard_spans(spans))  # disconnect ended the run's hop


def test_a_refused_run_raises_before_its_prompt_is_sent(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    async def run_inside_planner(loop: Any) -> None:
        async with otel_guard.delegate("planner"), otel_guard.delegate("budget"):
            await loop.run("planner", "Plan the team offsite")

    with (
        scripted_loop() as loop,
        pytest.raises(otel_guard.DelegationRefused, match="agent planner is already"),
    ):
        asyncio.run(asyncio.wait_for(run_inside_planner(loop), timeout=60))
    assert loop.api is not None
    assert loop.api.agent_requests() == []  # the model never saw the prompt
    assert [d[:2] for d in decisions(spans)][-1] == ("invoke_agent planner", "refuse")
