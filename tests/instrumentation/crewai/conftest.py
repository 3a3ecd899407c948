"""CrewAI tests: offline, and checked to stay offline; the instrumentor, installed for one test.

CrewAI's own telemetry and trace collection are switched off before CrewAI is imported, its files
go to a temporary directory instead of the user's, and every test fails if anything in the process
(a thread of CrewAI's included) connects to, or looks up, a host other than this one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crewai_offline import watch_network

os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
_DATA_HOME = tempfile.mkdtemp(prefix="otel-guard-crewai-")
os.environ["XDG_DATA_HOME"] = _DATA_HOME  # CrewAI's task-output database and the like

_external = watch_network()

# CrewAI's lazily loaded subpackages raise ImportWarning as it imports them, which the suite's
# "error" filter would turn into a failed collection; imported here once, quietly.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ImportWarning)
    import crewai  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.filterwarnings("ignore::ImportWarning"))  # CrewAI's, as above


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_DATA_HOME, ignore_errors=True)


@pytest.fixture(autouse=True)
def _stays_offline() -> Iterator[None]:
    _external.clear()
    yield
    assert _external == [], f"the test reached beyond this host: {_external}"


@pytest.fixture(autouse=True)
def _quiet_console() -> None:
    # A standalone kickoff prints panels from CrewAI's event thread unless its console formatter is
    # quiet, which is what Crew(verbose=False) sets too.
    from crewai.events.event_listener import event_listener

    event_listener.formatter.verbose = False


@pytest.fixture
def instrumented() -> Iterator[Any]:
    from otel_guard.instrumentation.crewai import CrewAIInstrumentor

    instrumentor = CrewAIInstrumentor()
    instrumentor.instrument()
    assert instrumentor.is_instrumented_by_opentelemetry, "the installed crewai failed the version check"
    yield instrumentor
    instrumentor.uninstrument()
