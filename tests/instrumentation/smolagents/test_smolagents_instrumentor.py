"""The smolagents instrumentor itself: its patch targets exist in the installed smolagents, its
metadata is in step with the distribution's, it patches smolagents only when the app imports it, and
the providers given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from smolagents_loop import Ask, CallBudget, ScriptedModel, agent

from otel_guard import telemetry
from otel_guard.instrumentation.smolagents import PATCH_TARGETS, SmolagentsInstrumentor
from otel_guard.instrumentation.smolagents.package import _instruments
from tests.hop_spans import guard_spans
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_every_patch_target_exists_in_the_installed_smolagents() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_smolagents() -> None:
    assert_registered(SmolagentsInstrumentor, "otel_guard_smolagents", _instruments)


# -- lazy patching ------------------------------------------------------------------------------


@pytest.mark.integration
def test_smolagents_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        SmolagentsInstrumentor, "import smolagents", ["smolagents"], uninstrument_first=False
    )
    assert report["loaded_before"] == [], "instrument() imported smolagents before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_smolagents_unpatched() -> None:
    report = patched_on_import(
        SmolagentsInstrumentor, "import smolagents", ["smolagents"], uninstrument_first=True
    )
    assert report["patched"] == [False] * len(PATCH_TARGETS)


# -- providers ----------------------------------------------------------------------------------


def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(SmolagentsInstrumentor) as given:
        lookup = Ask("lookup", "Look something up.", lambda question: "found")
        model = ScriptedModel("searcher", "lookup", CallBudget(1))
        agent("searcher", model, [lookup]).run("find")

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent searcher"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider
