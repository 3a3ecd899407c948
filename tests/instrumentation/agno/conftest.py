"""Agno tests: offline, and checked to stay offline.

Every test fails if anything in the process (a thread of the runtime's included) looks up, or connects
to, a host other than this one: the scripted models must be all the models there are.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.instrumentation.crewai.crewai_offline import watch_network

_external = watch_network()


@pytest.fixture(autouse=True)
def _stays_offline() -> Iterator[None]:
    _external.clear()
    yield
    assert _external == [], f"the test reached beyond this host: {_external}"
