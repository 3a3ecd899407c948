"""The CrewAI instrumentor as OpenTelemetry uses it: its entry point and version range, patch targets
that exist in the installed CrewAI, patching at CrewAI's first import, and the providers it is given.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from crewai_app import ScriptedLLM, agent

from otel_guard import telemetry
from otel_guard.instrumentation.crewai import (
    INTERNAL_NAMES,
    PATCH_TARGETS,
    CrewAIInstrumentor,
)
from otel_guard.instrumentation.crewai.package import _instruments
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_the_entry_point_and_the_version_range_match_the_installed_crewai() -> None:
    assert_registered(CrewAIInstrumentor, "otel_guard_crewai", _instruments)


def test_every_patch_target_and_internal_name_exists_in_the_installed_crewai() -> None:
    missing = unresolved((*PATCH_TARGETS, *INTERNAL_NAMES))
    assert not missing, "\n".join(missing)
    # Read on the tool the hooks are handed: the BaseTool a CrewStructuredTool was made from.
    from crewai.tools.structured_tool import CrewStructuredTool

    assert "_original_tool" in CrewStructuredTool.__private_attributes__
    from crewai.tools.agent_tools.base_agent_tools import BaseAgentTool

    assert "agents" in BaseAgentTool.model_fields
    # The model-call hooks an executor copied when CrewAI built it, which a run adds the guard's to.
    from crewai.agents.agent_executor import AgentExecutor

    assert {"before_llm_call_hooks", "after_llm_call_hooks"} <= set(AgentExecutor.model_fields)


def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(CrewAIInstrumentor) as given:
        solo = agent("solo", ScriptedLLM(model="scripted", agent="solo", max_tool_calls=0), [])
        solo.kickoff("hello")

    assert given.hop_names() == ["invoke_agent solo"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert spans.all() == []  # nothing went to the global provider


# -- lazy patching ------------------------------------------------------------------------------

# The guard's hooks in CrewAI's hook registry after the import.
HOOKS = """
from crewai.hooks.dispatch import InterceptionPoint, get_hooks
report = sorted(
    h.__name__ for p in InterceptionPoint for h in get_hooks(p) if h.__name__.startswith("otel_guard")
)
"""
# With a model budget on from the start, instrument() registers the model-call hooks as well.
MODEL_BUDGET = {"OTEL_GUARD_MAX_MODEL_REQUESTS": "50"}


def run_lazy(uninstrument_first: bool) -> dict[str, Any]:
    return patched_on_import(
        CrewAIInstrumentor,
        "import crewai",
        ["crewai"],
        uninstrument_first=uninstrument_first,
        after=HOOKS,
        env=MODEL_BUDGET,
    )


@pytest.mark.integration
def test_crewai_is_patched_when_the_app_first_imports_it() -> None:
    report = run_lazy(uninstrument_first=False)

    assert report["loaded_before"] == [], "instrument() imported CrewAI before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)
    assert report["after"] == [
        "otel_guard_add_guidance",
        "otel_guard_after_model_call",
        "otel_guard_after_tool_call",
        "otel_guard_before_model_call",
        "otel_guard_before_tool_call",
    ]


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_crewai_alone() -> None:
    report = run_lazy(uninstrument_first=True)

    assert report["patched"] == [False] * len(PATCH_TARGETS)
    assert report["after"] == []


def test_the_trigger_of_lazy_patching_is_the_crewai_package() -> None:
    assert CrewAIInstrumentor().trigger_modules == ("crewai",)
    assert importlib.util.find_spec("crewai") is not None
