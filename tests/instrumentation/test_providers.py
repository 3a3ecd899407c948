"""``instrument(tracer_provider=..., meter_provider=...)`` sends the guard's hops to those providers,
for every runtime's instrumentor, as OpenTelemetry instrumentors do."""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import Any

import pytest
from instrumentors import given_providers, our_entry_points

from otel_guard import delegate, telemetry

# The runtimes installed here; the others are tested in tests/instrumentation/<runtime>.
OURS = our_entry_points()


@pytest.mark.parametrize("entry_point", OURS, ids=lambda ep: ep.name)
def test_hops_go_to_the_providers_given_to_instrument(entry_point: EntryPoint, spans: Any) -> None:
    with given_providers(entry_point.load()) as given, delegate("planner", "plan"):
        pass
    assert given.hop_names() == ["invoke_agent planner"]
    assert telemetry.METRIC_DECISIONS in given.metric_names()
    assert spans.all() == []  # nothing went to the global provider
