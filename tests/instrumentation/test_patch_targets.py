"""Every instrumentor's patch targets exist in the installed runtimes, and the metadata is in step.

Internal patch targets move between runtime versions. When one disappears this test names it, so an
upgrade fails here rather than by silently not guarding anything.
"""

from __future__ import annotations

import importlib
from importlib.metadata import distribution

import pytest
from instrumentors import OWN_ENVIRONMENT, our_entry_points
from packaging.requirements import Requirement

from otel_guard.instrumentation._base import GuardInstrumentor, PatchTarget, resolve
from otel_guard.instrumentation.http import HTTPClientsInstrumentor

# The runtimes installed here; the others check their patch targets in tests/instrumentation/<runtime>.
OURS = our_entry_points()


def test_every_runtime_has_an_instrumentor_entry_point() -> None:
    assert [ep.name for ep in our_entry_points(here_only=False)] == [
        "otel_guard_a2a",
        "otel_guard_agent_framework",
        "otel_guard_agno",
        "otel_guard_claude_agent_sdk",
        "otel_guard_crewai",
        "otel_guard_dspy",
        "otel_guard_google_adk",
        "otel_guard_haystack",
        "otel_guard_http",
        "otel_guard_langgraph",
        "otel_guard_llama_index",
        "otel_guard_mcp",
        "otel_guard_openai_agents",
        "otel_guard_pydantic_ai",
        "otel_guard_smolagents",
        "otel_guard_strands",
    ]
    assert {ep.name for ep in OURS} | OWN_ENVIRONMENT == {ep.name for ep in our_entry_points(here_only=False)}


@pytest.mark.parametrize("entry_point", OURS, ids=lambda ep: ep.name)
def test_patch_targets_exist_in_the_installed_runtime(entry_point: object) -> None:
    instrumentor_class = entry_point.load()  # type: ignore[attr-defined]
    # The HTTP clients' instrumentor guards three optional libraries (each installed here), not one runtime.
    assert issubclass(instrumentor_class, (GuardInstrumentor, HTTPClientsInstrumentor))
    module = importlib.import_module(instrumentor_class.__module__)
    targets: tuple[PatchTarget, ...] = module.PATCH_TARGETS
    assert targets, f"{module.__name__} lists no PATCH_TARGETS"
    missing = []
    for target in targets:
        try:
            resolve(target)
        except LookupError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_resolve_names_a_missing_target() -> None:
    with pytest.raises(LookupError, match=r"opentelemetry\.trace\.NoSuchThing"):
        resolve(("opentelemetry.trace", "NoSuchThing.method"))
    with pytest.raises(LookupError, match="no_such_module"):
        resolve(("no_such_module", "f"))


def test_instruments_any_extra_matches_the_instrumentors() -> None:
    """opentelemetry-instrument checks the distribution's ``instruments-any`` extra; each instrumentor
    checks its own runtime again. Both must name the same version ranges."""
    declared = set()
    for text in distribution("otel-guard").requires or []:
        requirement = Requirement(text)
        if requirement.marker is not None and requirement.marker.evaluate({"extra": "instruments-any"}):
            declared.add(str(Requirement(text.split(";")[0])))
    instrumented = set()
    for entry_point in our_entry_points(here_only=False):
        for dependency in entry_point.load()().instrumentation_dependencies():
            instrumented.add(str(Requirement(dependency)))
    assert declared == instrumented
