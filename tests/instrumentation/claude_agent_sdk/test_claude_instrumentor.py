"""The Claude Agent SDK instrumentor itself: its patch targets exist in the installed SDK, its
metadata is in step with the distribution's, it patches the SDK only when the app imports it, the
providers given to ``instrument()`` get the hops of a real run, and suppression makes none; a run's
``Query`` and options are freed when the run ends, as an unguarded run's are."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest
from claude_loop import scripted_loop
from opentelemetry.instrumentation.utils import suppress_instrumentation

from otel_guard import telemetry
from otel_guard.instrumentation.claude_agent_sdk import PATCH_TARGETS, ClaudeAgentSDKInstrumentor
from otel_guard.instrumentation.claude_agent_sdk.package import _instruments
from tests.hop_spans import guard_spans
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    instrumentor_fixture,
    patched_on_import,
    unresolved,
)

instrumented = instrumentor_fixture(ClaudeAgentSDKInstrumentor)


def test_every_patch_target_exists_in_the_installed_sdk() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_sdk() -> None:
    assert_registered(ClaudeAgentSDKInstrumentor, "otel_guard_claude_agent_sdk", _instruments)


@pytest.mark.integration
def test_the_sdk_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        ClaudeAgentSDKInstrumentor, "import claude_agent_sdk", ["claude_agent_sdk"], uninstrument_first=False
    )
    assert report["loaded_before"] == [], "instrument() imported claude_agent_sdk before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_the_sdk_unpatched() -> None:
    report = patched_on_import(
        ClaudeAgentSDKInstrumentor, "import claude_agent_sdk", ["claude_agent_sdk"], uninstrument_first=True
    )
    assert report["patched"] == [False] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(ClaudeAgentSDKInstrumentor) as given, scripted_loop(max_tool_calls=1) as loop:
        asyncio.run(loop.run("planner", "Plan the team offsite"))

    assert given.hop_names() == ["execute_tool budget", "invoke_agent planner"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider


@pytest.mark.integration
def test_suppressed_instrumentation_makes_no_hop(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    with scripted_loop(max_tool_calls=3) as loop, suppress_instrumentation():
        asyncio.run(loop.run("planner", "Plan the team offsite"))
    assert guard_spans(spans) == []
    assert loop.calls.made == 3


@pytest.mark.integration
def test_a_run_suppressed_inside_a_guarded_tool_makes_no_hop(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    """planner's tool runs budget with instrumentation suppressed: budget's SDK tool calls (and the
    planner run one of them makes) serve no run of the guard's, not planner's outer one."""
    with scripted_loop(max_tool_calls=3) as loop:
        loop.suppressed = frozenset({"budget"})
        asyncio.run(loop.run("planner", "Plan the team offsite"))

    assert [span.name for span in guard_spans(spans)] == ["invoke_agent planner", "execute_tool budget"]
    assert loop.calls.made == 3
    assert not any("Refused" in text for texts in loop.results.values() for text in texts)


@pytest.mark.integration
def test_a_guarded_run_leaves_its_query_and_options_to_reference_counting(
    instrumented: ClaudeAgentSDKInstrumentor, spans: Any
) -> None:
    """The run's ``Query`` holds the guard's run (its hooks); were the run to hold the Query back, the
    two and all they hold (the transport, its streams) would wait for the garbage collector. The SDK
    leaves its MCP server's session task to the collector, and that task's context holds the run it
    served: an ended run holds the run's options no more."""
    from claude_agent_sdk import ClaudeSDKClient

    async def session(loop: Any) -> tuple[weakref.ref[Any], weakref.ref[Any]]:
        options = loop.options("planner")
        async with ClaudeSDKClient(options=options) as client:
            await client.query("Plan the team offsite")
            _ = [message async for message in client.receive_response()]
            return weakref.ref(client._query), weakref.ref(options)

    with scripted_loop(max_tool_calls=1) as loop:
        gc.collect()
        gc.disable()
        try:
            query, options = asyncio.run(asyncio.wait_for(session(loop), timeout=60))
            freed = (query() is None, options() is None)
        finally:
            gc.enable()

    assert [span.name for span in guard_spans(spans)] == ["invoke_agent planner", "execute_tool budget"]
    assert freed == (True, True), "the run's Query or options outlived it (query, options freed)"
