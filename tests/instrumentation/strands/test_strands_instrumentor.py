"""The Strands instrumentor itself: its patch targets exist in the installed Strands, its metadata is
in step with the distribution's, it patches Strands only when the app imports it, and the providers
given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from strands import Agent, tool
from strands_loop import CallBudget, ScriptedModel
from strands_support import guard_spans

from otel_guard import telemetry
from otel_guard.instrumentation.strands import PATCH_TARGETS, StrandsInstrumentor
from otel_guard.instrumentation.strands._tool_stream import INTERNAL_NAMES
from otel_guard.instrumentation.strands.package import _instruments
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_every_patch_target_and_internal_name_exists_in_the_installed_strands() -> None:
    missing = unresolved((*PATCH_TARGETS, *INTERNAL_NAMES))
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_strands() -> None:
    assert_registered(StrandsInstrumentor, "otel_guard_strands", _instruments)


# -- lazy patching ------------------------------------------------------------------------------

# The swarm module is patched when the app imports it, not with strands itself.
APP_IMPORT = "import strands, sys\nmultiagent = 'strands.multiagent' in sys.modules"


@pytest.mark.integration
def test_strands_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        StrandsInstrumentor, APP_IMPORT, ["strands"], uninstrument_first=False, after="report = multiagent"
    )
    assert report["loaded_before"] == [], "instrument() imported Strands before the app did"
    assert report["pending"] is True
    assert report["after"] is False  # strands.multiagent was not imported with strands
    assert report["patched"] == [True] * len(PATCH_TARGETS)  # resolving them imported it


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_strands_unpatched() -> None:
    report = patched_on_import(StrandsInstrumentor, APP_IMPORT, ["strands"], uninstrument_first=True)
    assert report["patched"] == [False] * len(PATCH_TARGETS)


# -- providers ----------------------------------------------------------------------------------


async def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(StrandsInstrumentor) as given:

        @tool
        def lookup(question: str) -> str:
            """Look something up."""
            return question

        model = ScriptedModel("searcher", "lookup", CallBudget(1))
        agent = Agent(name="searcher", model=model, tools=[lookup], callback_handler=None)
        await agent.invoke_async("find")

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent searcher"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    # Nothing of the guard's went to the global provider (Strands' own spans did).
    assert guard_spans(spans) == []
    assert spans.all()
