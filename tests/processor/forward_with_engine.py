"""A pytest plugin: every Forwarder the tests make sends with the engine's own gRPC client (the
``h2-forwarder`` prototype) rather than grpcio: ``pytest -p forward_with_engine tests/processor/...``
with ``tests/processor`` on the path, as ``scripts/check`` runs the forwarding tests on it."""

from __future__ import annotations

import pytest

from otel_guard_processor import forward_client, forwarder


def pytest_configure(config: pytest.Config) -> None:
    if not forward_client.available():
        raise pytest.UsageError("the engine was built without the h2-forwarder feature")
    forwarder.CLIENT = "engine"
