"""The Agno instrumentor itself: its patch targets exist in the installed Agno, its metadata is in step
with the distribution's, it patches Agno only when the app imports it, and the providers given to
``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from agno.agent import Agent
from agno_loop import CallBudget, scripted

from otel_guard import telemetry
from otel_guard.instrumentation.agno import PATCH_TARGETS, AgnoInstrumentor
from otel_guard.instrumentation.agno.package import _instruments
from tests.hop_spans import guard_spans
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def lookup(question: str) -> str:
    """Look the question up."""
    return "found"


def test_every_patch_target_exists_in_the_installed_agno() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_agno() -> None:
    assert_registered(AgnoInstrumentor, "otel_guard_agno", _instruments)


@pytest.mark.integration
def test_agno_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(AgnoInstrumentor, "import agno.agent", ["agno"], uninstrument_first=False)
    assert report["loaded_before"] == [], "instrument() imported agno before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_agno_unpatched() -> None:
    report = patched_on_import(AgnoInstrumentor, "import agno.agent", ["agno"], uninstrument_first=True)
    assert report["patched"] == [False] * len(PATCH_TARGETS)


def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(AgnoInstrumentor) as given:
        model = scripted("searcher", "lookup", CallBudget(1), question="find")
        Agent(name="searcher", model=model, tools=[lookup], telemetry=False).run("find")

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent searcher"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider
