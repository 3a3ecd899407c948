"""The Jaeger tests: a Jaeger per test (``jaeger``), and the Collector and processor tests' helpers."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for folder in ("collector", "processor", "processor/dialects"):
    sys.path.insert(0, str(TESTS / folder))

from jaeger_store import JaegerStore  # noqa: E402


@pytest.fixture
async def jaeger(tmp_path: Path) -> AsyncIterator[JaegerStore]:
    """A running Jaeger, healthy, stopped after the test."""
    store = JaegerStore(tmp_path)
    store.start()
    try:
        await store.ready()
        yield store
    finally:
        store.stop()
