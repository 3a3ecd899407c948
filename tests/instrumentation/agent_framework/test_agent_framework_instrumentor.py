"""The Agent Framework instrumentor itself: its patch target and the names it reads exist in the
installed Agent Framework, its metadata is in step with the distribution's, it patches Agent Framework
only when the app imports it, and the providers given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from agent_framework import Agent, tool
from agent_framework_loop import CallBudget, ScriptedClient
from agent_framework_support import guard_spans

from otel_guard import telemetry
from otel_guard.instrumentation.agent_framework import (
    INTERNAL_NAMES,
    PATCH_TARGETS,
    AgentFrameworkInstrumentor,
)
from otel_guard.instrumentation.agent_framework._tools import AGENT_TOOL, agent_behind
from otel_guard.instrumentation.agent_framework.package import _instruments
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_every_patch_target_and_internal_name_exists_in_the_installed_agent_framework() -> None:
    missing = unresolved((*PATCH_TARGETS, *INTERNAL_NAMES))
    assert not missing, "\n".join(missing)


def test_the_agent_behind_an_as_tool_tool_is_found() -> None:
    # as_tool() keeps no reference to its agent but in the function it wraps: the guard reads it there.
    client = ScriptedClient("budget", None, CallBudget(0))
    budget = Agent(client=client, name="budget")
    made = budget.as_tool(name="ask_budget")
    assert made.func.__qualname__ == AGENT_TOOL  # type: ignore[union-attr]
    assert agent_behind(made) is budget

    @tool
    def lookup(question: str) -> str:
        """Look something up."""
        return question

    assert agent_behind(lookup) is None


def test_the_entry_point_and_the_dependency_range_match_the_installed_agent_framework() -> None:
    assert_registered(AgentFrameworkInstrumentor, "otel_guard_agent_framework", _instruments)


# -- lazy patching ------------------------------------------------------------------------------


@pytest.mark.integration
def test_agent_framework_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        AgentFrameworkInstrumentor, "import agent_framework", ["agent_framework"], uninstrument_first=False
    )
    assert report["loaded_before"] == [], "instrument() imported Agent Framework before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_agent_framework_unpatched() -> None:
    report = patched_on_import(
        AgentFrameworkInstrumentor, "import agent_framework", ["agent_framework"], uninstrument_first=True
    )
    assert report["patched"] == [False] * len(PATCH_TARGETS)


# -- providers ----------------------------------------------------------------------------------


async def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(AgentFrameworkInstrumentor) as given:

        @tool
        def lookup(question: str) -> str:
            """Look something up."""
            return question

        client = ScriptedClient("searcher", "lookup", CallBudget(1))
        await Agent(client=client, name="searcher", tools=[lookup]).run("find")

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent searcher"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    # Nothing of the guard's went to the global provider (Agent Framework's own spans did).
    assert guard_spans(spans) == []
    assert spans.all()
