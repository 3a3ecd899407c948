"""The CrewAI instrumentor as OpenTelemetry uses it: its entry point and version range, patch targets
that exist in the installed CrewAI, patching at CrewAI's first import, and the providers it is given.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from crewai_app import ScriptedLLM, agent
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_guard import telemetry
from otel_guard.instrumentation.crewai import (
    INTERNAL_NAMES,
    PATCH_TARGETS,
    CrewAIInstrumentor,
)
from otel_guard.instrumentation.crewai.package import _instruments
from tests.instrumentation.instrumentors import unresolved


def test_the_entry_point_names_the_instrumentor() -> None:
    (found,) = [
        ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name == "otel_guard_crewai"
    ]
    assert found.load() is CrewAIInstrumentor


def test_the_version_range_is_the_tested_one_and_admits_the_installed_crewai() -> None:
    assert tuple(CrewAIInstrumentor().instrumentation_dependencies()) == _instruments
    assert CrewAIInstrumentor()._check_dependency_conflicts() is None


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


@pytest.fixture
def restore_global_telemetry() -> Iterator[None]:
    yield
    telemetry.bind()  # back to the global providers the rest of the suite reads


@pytest.mark.usefixtures("restore_global_telemetry")
def test_hops_go_to_the_providers_given_to_instrument(spans: Any) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    instrumentor = CrewAIInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    try:
        solo = agent("solo", ScriptedLLM(model="scripted", agent="solo", max_tool_calls=0), [])
        solo.kickoff("hello")
    finally:
        instrumentor.uninstrument()

    assert [span.name for span in exporter.get_finished_spans()] == ["invoke_agent solo"]
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert telemetry.METRIC_DECISIONS in names
    assert spans.all() == []  # nothing went to the global provider


LAZY_PROGRAM = textwrap.dedent(
    """
    import importlib, json, sys, warnings
    import wrapt
    from importlib.metadata import entry_points
    from otel_guard.instrumentation._base import resolve

    uninstrument_first = sys.argv[1] == "yes"
    ours = [ep.load() for ep in entry_points(group="opentelemetry_instrumentor")
            if ep.value.startswith("otel_guard.")]
    instrumentors = {cls.__name__: cls() for cls in ours}
    for instrumentor in instrumentors.values():
        instrumentor.instrument()  # every runtime's: those not installed here are skipped
    loaded_before = "crewai" in sys.modules
    instrumentor = instrumentors["CrewAIInstrumentor"]
    pending = instrumentor.is_instrumented_by_opentelemetry
    if uninstrument_first:
        instrumentor.uninstrument()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import crewai  # the app's first import of the runtime
    from crewai.hooks.dispatch import InterceptionPoint, get_hooks
    proxy = getattr(wrapt, "BaseObjectProxy", wrapt.ObjectProxy)
    module = sys.modules[type(instrumentor).__module__]
    patched = [isinstance(resolve(t), proxy) for t in module.PATCH_TARGETS]
    hooks = sorted(
        h.__name__ for p in InterceptionPoint for h in get_hooks(p) if h.__name__.startswith("otel_guard")
    )
    report = {"loaded_before": loaded_before, "pending": pending, "patched": patched, "hooks": hooks}
    print(json.dumps(report))
    """
)


def run_lazy(uninstrument_first: bool) -> dict[str, Any]:
    # With a model budget on from the start, instrument() registers the model-call hooks as well.
    env = {**os.environ, "OTEL_GUARD_MAX_MODEL_REQUESTS": "50"}
    done = subprocess.run(
        [sys.executable, "-c", LAZY_PROGRAM, "yes" if uninstrument_first else "no"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.integration
def test_crewai_is_patched_when_the_app_first_imports_it() -> None:
    report = run_lazy(uninstrument_first=False)

    assert report["loaded_before"] is False, "instrument() imported CrewAI before the app did"
    assert report["pending"] is True
    assert report["patched"] == [True] * len(PATCH_TARGETS)
    assert report["hooks"] == [
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
    assert report["hooks"] == []


def test_the_trigger_of_lazy_patching_is_the_crewai_package() -> None:
    assert CrewAIInstrumentor().trigger_modules == ("crewai",)
    assert importlib.util.find_spec("crewai") is not None
