"""The Agent Framework instrumentor itself: its patch target and the names it reads exist in the
installed Agent Framework, its metadata is in step with the distribution's, it patches Agent Framework
only when the app imports it, and the providers given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest
from agent_framework import Agent, tool
from agent_framework_loop import CallBudget, ScriptedClient
from agent_framework_orchestrations._handoff import HandoffAgentExecutor, HandoffConfiguration
from agent_framework_support import guard_spans
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from packaging.requirements import Requirement

from otel_guard import telemetry
from otel_guard.instrumentation.agent_framework import (
    HANDOFF_TARGETS,
    INTERNAL_NAMES,
    PATCH_TARGETS,
    AgentFrameworkInstrumentor,
)
from otel_guard.instrumentation.agent_framework._handoffs import HANDOFF_TOOL, is_handoff
from otel_guard.instrumentation.agent_framework._tools import AGENT_TOOL, agent_behind
from otel_guard.instrumentation.agent_framework.package import _handoff_instruments, _instruments
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_every_patch_target_and_internal_name_exists_in_the_installed_agent_framework() -> None:
    missing = unresolved((*PATCH_TARGETS, *HANDOFF_TARGETS, *INTERNAL_NAMES))
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


def test_a_handoff_workflows_handoff_tools_are_known_and_no_other_tool_is() -> None:
    # HandoffBuilder's handoff_to_{target} tools are known by the function they wrap (_handoffs).
    planner = Agent(client=ScriptedClient("planner", None, CallBudget(0)), name="planner")
    budget = Agent(client=ScriptedClient("budget", None, CallBudget(0)), name="budget")
    executor = HandoffAgentExecutor(planner, [HandoffConfiguration(target=budget)])
    tools = executor.agent.default_options["tools"]
    assert [t.name for t in tools if is_handoff(t)] == ["handoff_to_budget"]
    assert tools[0].func.__qualname__ == HANDOFF_TOOL
    assert not is_handoff(budget.as_tool(name="handoff_to_budget"))


def test_the_entry_point_and_the_dependency_range_match_the_installed_agent_framework() -> None:
    assert_registered(AgentFrameworkInstrumentor, "otel_guard_agent_framework", _instruments)


def test_the_extra_installs_the_orchestrations_at_the_versions_whose_handoffs_are_guarded() -> None:
    extra = {
        str(Requirement(text.split(";")[0]))
        for text in distribution("otel-guard").requires or []
        if (marker := Requirement(text).marker) is not None and marker.evaluate({"extra": "agent-framework"})
    }
    assert {str(Requirement(r)) for r in (*_instruments, *_handoff_instruments)} == extra
    assert get_dependency_conflicts(list(_handoff_instruments)) is None


# -- lazy patching ------------------------------------------------------------------------------

# After the app's import of agent_framework: whether that imported the orchestrations, then whether
# a handoff workflow's import of them (later, if at all) patched them.
HANDOFFS = """
import sys
import wrapt
from otel_guard.instrumentation._base import resolve
from otel_guard.instrumentation.agent_framework import HANDOFF_TARGETS

before = "agent_framework_orchestrations" in sys.modules
import agent_framework_orchestrations
proxy = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
report = {"before": before, "patched": [isinstance(resolve(t), proxy) for t in HANDOFF_TARGETS]}
"""


@pytest.mark.integration
def test_agent_framework_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        AgentFrameworkInstrumentor,
        "import agent_framework",
        ["agent_framework"],
        uninstrument_first=False,
        after=HANDOFFS,
    )
    assert report["loaded_before"] == [], "instrument() imported Agent Framework before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)
    assert report["after"]["before"] is False, "the guard imported agent-framework-orchestrations"
    assert report["after"]["patched"] == [True] * len(HANDOFF_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_agent_framework_unpatched() -> None:
    report = patched_on_import(
        AgentFrameworkInstrumentor,
        "import agent_framework",
        ["agent_framework"],
        uninstrument_first=True,
        after=HANDOFFS,
    )
    assert report["patched"] == [False] * len(PATCH_TARGETS)
    assert report["after"]["patched"] == [False] * len(HANDOFF_TARGETS)


WITHOUT_ORCHESTRATIONS = textwrap.dedent(
    """
    import asyncio, sys
    sys.modules["agent_framework_orchestrations"] = None  # as if it were not installed
    from otel_guard.instrumentation.agent_framework import AgentFrameworkInstrumentor

    instrumentor = AgentFrameworkInstrumentor()
    instrumentor.instrument()
    from agent_framework import Agent
    from agent_framework_loop import CallBudget, ScriptedClient

    agent = Agent(client=ScriptedClient("solo", None, CallBudget(0)), name="solo")
    print(asyncio.run(agent.run("hello")).text)
    """
)


@pytest.mark.integration
def test_without_agent_framework_orchestrations_the_core_is_guarded_all_the_same() -> None:
    # Handoffs are an optional package's: its absence never stops the guard from instrumenting.
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ORCHESTRATIONS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "solo answers without tools"


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
