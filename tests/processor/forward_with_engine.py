"""A pytest plugin: every Forwarder the tests make sends with the engine's own gRPC client (the
``h2-forwarder`` prototype, or with ``FORWARD_WITH_ENGINE_CLIENT=tonic`` its tonic variant)
rather than grpcio: ``pytest -p forward_with_engine tests/processor/...`` with ``tests/processor``
on the path, on an engine built with that feature (docs/processor.md, *The forwarder's client*)."""

from __future__ import annotations

import os

import pytest
from otel_guard_processor import forward_client, forwarder


def pytest_configure(config: pytest.Config) -> None:
    if not forward_client.available():
        raise pytest.UsageError("the engine was built without the h2-forwarder feature")
    forwarder.CLIENT = os.environ.get("FORWARD_WITH_ENGINE_CLIENT", "engine")  # or tonic
