"""Haystack tests: offline, and checked to stay offline.

Haystack sends usage telemetry (posthog) unless ``HAYSTACK_TELEMETRY_ENABLED`` is false: it is set
here, before any test imports Haystack, and every test fails if anything in the process (a thread of
Haystack's included) looks up, or connects to, a host other than this one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.instrumentation.crewai.crewai_offline import watch_network

os.environ["HAYSTACK_TELEMETRY_ENABLED"] = "False"

_external = watch_network()


@pytest.fixture(autouse=True)
def _stays_offline() -> Iterator[None]:
    _external.clear()
    yield
    assert _external == [], f"the test reached beyond this host: {_external}"
