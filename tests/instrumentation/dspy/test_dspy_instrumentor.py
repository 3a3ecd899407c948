"""The DSPy instrumentor itself: its patch targets exist in the installed DSPy, its metadata is in step
with the distribution's, it patches DSPy only when the app imports it, and the providers given to
``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from dspy_loop import CallBudget, ScriptedLM, react

from otel_guard import telemetry
from otel_guard.instrumentation.dspy import PATCH_TARGETS, DSPyInstrumentor
from otel_guard.instrumentation.dspy.package import _instruments
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


def test_every_patch_target_exists_in_the_installed_dspy() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_dspy() -> None:
    assert_registered(DSPyInstrumentor, "otel_guard_dspy", _instruments)


@pytest.mark.integration
def test_dspy_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(DSPyInstrumentor, "import dspy", ["dspy"], uninstrument_first=False)
    assert report["loaded_before"] == [], "instrument() imported dspy before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_dspy_unpatched() -> None:
    report = patched_on_import(DSPyInstrumentor, "import dspy", ["dspy"], uninstrument_first=True)
    assert report["patched"] == [False] * len(PATCH_TARGETS)


def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(DSPyInstrumentor) as given:
        react("searcher", ScriptedLM("searcher", "lookup", CallBudget(1)), [lookup])(question="find")

    assert given.hop_names() == ["execute_tool lookup", "invoke_agent searcher"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider
