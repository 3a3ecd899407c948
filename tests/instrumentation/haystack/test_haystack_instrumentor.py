"""The Haystack instrumentor itself: its patch targets exist in the installed Haystack, its metadata is
in step with the distribution's, it patches Haystack only when the app imports it, and the providers
given to ``instrument()`` get the hops of a real run."""

from __future__ import annotations

from typing import Any

import pytest
from haystack_loop import agent_loop

from otel_guard import telemetry
from otel_guard.instrumentation.haystack import PATCH_TARGETS, HaystackInstrumentor
from otel_guard.instrumentation.haystack.package import _instruments
from tests.hop_spans import guard_spans
from tests.instrumentation.instrumentors import (
    assert_registered,
    given_providers,
    patched_on_import,
    unresolved,
)


def test_every_patch_target_exists_in_the_installed_haystack() -> None:
    missing = unresolved(PATCH_TARGETS)
    assert not missing, "\n".join(missing)


def test_the_entry_point_and_the_dependency_range_match_the_installed_haystack() -> None:
    assert_registered(HaystackInstrumentor, "otel_guard_haystack", _instruments)


@pytest.mark.integration
def test_haystack_is_patched_when_the_app_imports_it() -> None:
    report = patched_on_import(
        HaystackInstrumentor,
        "from haystack.components.agents import Agent",
        ["haystack"],
        uninstrument_first=False,
        env={"HAYSTACK_TELEMETRY_ENABLED": "False"},
    )
    assert report["loaded_before"] == [], "instrument() imported haystack before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)


@pytest.mark.integration
def test_uninstrument_before_the_import_leaves_haystack_unpatched() -> None:
    report = patched_on_import(
        HaystackInstrumentor,
        "from haystack.components.agents import Agent",
        ["haystack"],
        uninstrument_first=True,
        env={"HAYSTACK_TELEMETRY_ENABLED": "False"},
    )
    assert report["patched"] == [False] * len(PATCH_TARGETS)


def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    with given_providers(HaystackInstrumentor) as given:
        agent_loop(depth=2, max_tool_calls=1).run()

    assert given.hop_names() == ["invoke_agent budget", "invoke_agent planner"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert guard_spans(spans) == []  # nothing of the guard's went to the global provider
